/*
 * write_rule.h - where Lua code may write (internal to lua/): the sandbox's only write
 * permission, checked by every binding that creates, replaces or deletes a file.
 *
 * The results rule (gm.results, gm.results_merge, gm.write_text, gm.plot, trainer:save): a path
 * must lie inside the results folder, set by gm_lua_set_results_root (gm_lua.h; default
 * "results", taken from the working folder at the time of the check). A path with a ".."
 * component is refused outright; a relative path is taken from the working folder; the
 * comparison is lexical (a symlink inside the results folder is followed like any other path).
 * Missing folders between the results folder and the file are created. Reading is not
 * restricted (experiment files read their data anyway).
 *
 * The runner's rule (gm.make_results_dir, gm.remove_checkpoint, lua/bind_run.c): a relative
 * path starting with "results", without "..".
 *
 * Errors: a refused path is bad input in the file (exit code 2, like the sandbox's other
 * refusals): the results rule raises a usage error object naming the function, the path and
 * the results folder; the runner's rule, used by the runner's own code only, raises a plain Lua
 * error. Ownership: nothing is allocated; results live on the Lua stack.
 */
#ifndef GM_WRITE_RULE_H
#define GM_WRITE_RULE_H

#include <lua.h>

/* Raises unless `path` may be written under the results rule; creates its missing folders below
 * the results folder. `fn` names the binding in messages ("gm.plot"). */
void gm_bind_check_write_path(lua_State *L, const char *path, const char *fn);

/* Raises unless `path` may be written by model:save_adapter: the path gm_lua_allow_export_path
 * allowed (`gemmarun export`'s OUT), else the results rule. */
void gm_bind_check_export_path(lua_State *L, const char *path, const char *fn);

/* The string argument at idx, checked under the runner's rule (raises otherwise). */
const char *gm_bind_check_runner_path(lua_State *L, int idx);

#endif /* GM_WRITE_RULE_H */
