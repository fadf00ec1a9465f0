/*
 * bind_run.c - Lua bindings the experiment runner (lua/runner.lua) needs from C: reading data
 * files, hashing, model configs and memory plans without loading weights, candidate scoring
 * for classification, progress display and Ctrl-C. (JSON: lua/bind_json.c.)
 *
 *   gm.read_text(path) -> string             gm.list_dir(path) -> {name, ...} (sorted; files and folders)
 *   gm.lora_count(model, opts)               -> adapters, trainable parameters (targets checked on the model)
 *   gm.is_dir(path), gm.file_exists(path)    gm.sha256(text) -> hex
 *   gm.real_path(path) -> path               realpath(3): links and ./.. resolved (a folder walk
 *                                             meets a folder it has read before as the same path)
 *   gm.base64(bytes) -> text                  RFC 4648 base64 (OpenSSL's EVP_EncodeBlock): plots
 *                                             inlined in the HTML report (lua/report.lua)
 *   gm.remove_reproduction(path)              a `gemmarun reproduce` scratch trial and its checkpoint
 *   gm.isatty() -> bool (stderr)
 *   gm.build_info() -> {version, git_commit, compiler, blas, hdf5, lua, cjson, libc, cpu}
 *                                             what built this program and what it runs on (provenance)
 *   gm.progress(line [, final])               redraws one status line on a TTY, prints lines otherwise
 *   gm.interrupted() -> bool                  true once Ctrl-C was pressed (main installs the handler)
 *   gm.model_config(path_or_name) -> table    the config only (GGUF header, config.json or preset;
 *                                             preset = true for a built-in size: no weights)
 *   gm.plan(path_or_name, train_opts [, {images = per example, device = "cpu"}]) -> {[kind] = bytes,
 *                                             ["vision tower"] = bytes (with images), total = bytes, and for
 *                                             device "cuda" gpu = {arenas, context, total, host}}; with
 *                                             images, max_length is checked against their soft tokens
 *   gm.plan_fit(path_or_name, train_opts, limit) -> train_opts', total, chosen
 *   gm.make_results_dir(dir), gm.remove_checkpoint(path)   the runner's folders and checkpoints
 *   trainer:choose(dataset, {i, ...}, {tok, ...}) -> {k, ...}, {{logit, ...}, ...}
 *       for each example, the candidate whose first token has the highest logit at the response start
 *   trainer:score(dataset, {i, ...}) -> {logprob, ...}   sum of log p over each example's response
 *
 * Reading is allowed in the sandbox (experiment files must read their data); writing is not,
 * except where lua/write_rule.h allows it.
 */
#define _GNU_SOURCE
#include "bind_util.h"
#include "gm_lua.h"
#include "write_rule.h"

#include "gm_alloc.h"
#include "gm_audio_encoder.h"
#include "gm_config.h"
#include "gm_data.h"
#include "gm_fetch.h"
#include "gm_gguf.h"
#include "gm_h5.h"
#include "gm_mmap.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_plan.h"
#include "gm_train.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <gnu/libc-version.h>
#include <lauxlib.h>
#include <limits.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

volatile int gm_lua_interrupted;

void gm_lua_set_interrupted(void) { gm_lua_interrupted = 1; }

static int l_interrupted(lua_State *L) {
    lua_pushboolean(L, gm_lua_interrupted != 0);
    return 1;
}

static int l_read_text(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    char *buf = NULL;
    size_t len = 0;
    gm_error err = {0};
    if (gm_read_text_file(path, &buf, &len, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_pushlstring(L, buf, len);
    gm_free(buf);
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int l_list_dir(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    DIR *d = opendir(path);
    if (!d) return luaL_error(L, "%s: cannot list the folder (missing or not a folder)", path);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* hidden files, . and .. */
        char **nn = n == cap ? gm_realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names) : names;
        char *name = nn ? gm_strdup(e->d_name) : NULL;
        if (nn) names = nn;
        if (!name) { /* say so rather than return a partial listing */
            closedir(d);
            for (size_t i = 0; i < n; i++) gm_free(names[i]);
            gm_free(names);
            return luaL_error(L, "%s: out of memory listing the folder", path);
        }
        names[n++] = name;
    }
    closedir(d);
    if (n > 1) qsort(names, n, sizeof *names, cmp_str); /* qsort's base must not be NULL */
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
        gm_free(names[i]);
    }
    gm_free(names);
    return 1;
}

static int l_is_dir(lua_State *L) {
    struct stat st;
    lua_pushboolean(L, stat(luaL_checkstring(L, 1), &st) == 0 && S_ISDIR(st.st_mode));
    return 1;
}

static int l_real_path(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    char real[PATH_MAX]; /* on the stack: nothing to free if pushing the string raises */
    if (!realpath(path, real)) return luaL_error(L, "%s: cannot resolve the path (missing, or a broken link)", path);
    lua_pushstring(L, real);
    return 1;
}

static int l_file_exists(lua_State *L) {
    lua_pushboolean(L, access(luaL_checkstring(L, 1), R_OK) == 0);
    return 1;
}

static int l_sha256(lua_State *L) {
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (EVP_Digest(s, n, md, &mdlen, EVP_sha256(), NULL) != 1) return luaL_error(L, "sha256 failed");
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    lua_pushstring(L, hex);
    return 1;
}

/* The git commit this program was built from ("<12 hex>[-dirty]", "unknown" outside a checkout):
 * generated at every build by lua/build_info.cmake. */
extern const char gm_git_commit[];
/* OpenBLAS's build line ("OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"), from
 * its own API (declared here rather than through cblas.h, whose location depends on the build). */
extern char *openblas_get_config(void);

/* The CPU's model name from /proc/cpuinfo into buf ("unknown" when there is none). */
static void cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            colon += 1 + (colon[1] == ' ');
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(buf, cap, "%s", colon);
            break;
        }
    }
    fclose(f);
}

#ifdef __clang__
#define GM_COMPILER "clang " __clang_version__
#else
#define GM_COMPILER "gcc " __VERSION__
#endif

static int l_build_info(lua_State *L) {
    char h5[32], cpu[256];
    gm_h5_library_version(h5, sizeof h5);
    cpu_model(cpu, sizeof cpu);
    const char *const kv[][2] = {
        {"version", GM_VERSION},  {"git_commit", gm_git_commit},       {"compiler", GM_COMPILER},
        {"blas", openblas_get_config()}, {"hdf5", h5}, {"lua", LUA_RELEASE}, {"cjson", cJSON_Version()},
        {"libc", gnu_get_libc_version()}, {"cpu", cpu},
    };
    lua_createtable(L, 0, (int)(sizeof kv / sizeof kv[0]));
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        lua_pushstring(L, kv[i][1] ? kv[i][1] : "unknown");
        lua_setfield(L, -2, kv[i][0]);
    }
    return 1;
}

static int l_isatty(lua_State *L) {
    lua_pushboolean(L, isatty(2));
    return 1;
}

/* One status line: on a TTY redrawn in place (\r, cleared), else printed as a line. `final`
 * ends the line on a TTY. */
static int l_progress(lua_State *L) {
    const char *line = luaL_checkstring(L, 1);
    bool final = lua_toboolean(L, 2);
    if (isatty(2)) {
        fprintf(stderr, "\r\033[K%s%s", line, final ? "\n" : "");
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
    return 0;
}

/* ---- configs and plans without weights ---- */

static int l_model_config(lua_State *L) {
    const char *arg = luaL_checkstring(L, 1);
    gm_config cfg;
    gm_dtype stored, stored_embed;
    gm_error err = {0};
    if (gm_config_probe(arg, &cfg, &stored, &stored_embed, &err) != GM_OK) return gm_bind_raise(L, &err);
    gm_bind_push_config(L, &cfg);
    lua_pushstring(L, gm_dtype_name(stored));
    lua_setfield(L, -2, "stored_dtype");
    lua_pushboolean(L, gm_config_probe_is_preset(arg));
    lua_setfield(L, -2, "preset");
    return 1;
}


/* Arguments 1 (model path or name) and 2 (training options) of gm.plan / gm.plan_fit: the options
 * and the config from gm_config_probe, weights never loaded. Raises on any error. */
static void plan_args(lua_State *L, gm_train_opts *o, gm_config *cfg, gm_dtype *stored, gm_dtype *stored_embed) {
    const char *arg = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    gm_bind_read_train_opts(L, 2, "plan", o, 2);
    gm_error err = {0};
    if (gm_config_probe(arg, cfg, stored, stored_embed, &err) != GM_OK) gm_bind_raise(L, &err);
}

/* gm.lora_count(model, opts) -> adapters, trainable parameters: the adapters opts (targets,
 * layers, rank) give on that model, module names as PEFT names them (gm_model_prefix),
 * from its config and names alone; with vision_targets (not "none") also the tower's adapters and
 * their parameters (results 3 and 4), with audio_targets the audio encoder's (5 and 6; 3 and 4
 * then 0 without vision_targets). Raises with gm_lora_describe's message (targets that select no
 * module, unknown names, layers beyond the model; a model without a SigLIP tower for
 * vision_targets). Gemma 3n / 4 configs count on the Gemma 3 part of their layers, as the planner
 * does. */
/* gm.train_check(model, opts): raises with gm_train_opts_check's message when a trainer of that
 * model (a file or folder; its config alone is read) would refuse the options. */
static int l_train_check(lua_State *L) {
    gm_train_opts o;
    gm_config cfg;
    gm_dtype stored, stored_embed;
    plan_args(L, &o, &cfg, &stored, &stored_embed);
    gm_error err = {0};
    if (gm_train_opts_check(&cfg, &o, &err) != GM_OK) return gm_bind_raise(L, &err);
    return 0;
}

static int l_lora_count(lua_State *L) {
    gm_train_opts o;
    gm_config cfg;
    gm_dtype stored, stored_embed;
    plan_args(L, &o, &cfg, &stored, &stored_embed);
    const char *arg = lua_tostring(L, 1);
    char prefix[64] = "model.", path[1200];
    gm_error err = {0};
    if (!gm_config_probe_is_preset(arg) &&
        (gm_resolve_model(arg, path, sizeof path, &err) != GM_OK || gm_model_prefix(path, prefix, sizeof prefix, &err) != GM_OK))
        return gm_bind_raise(L, &err);
    const gm_arch_def *ar = gm_arch_get(cfg.arch);
    gm_lora lo;
    if (gm_lora_describe(&lo, &o.lora, ar ? ar : gm_arch_get(GM_ARCH_GEMMA3), &cfg, prefix, &err) != GM_OK)
        return gm_bind_raise(L, &err);
    lua_pushinteger(L, lo.n);
    lua_pushinteger(L, lo.n_params);
    gm_lora_free(&lo);
    bool vis = strcmp(o.vision_targets, "none") != 0, aud = strcmp(o.audio_targets, "none") != 0;
    if (!vis && !aud) return 2;
    /* the vision tower's adapters (vision_targets) and the audio encoder's (audio_targets), each on
     * its own config and module names, every block */
    for (int part = 0; part < 2; part++) {
        bool on = part == 0 ? vis : aud;
        if (!on) {
            lua_pushinteger(L, 0);
            lua_pushinteger(L, 0);
            continue;
        }
        gm_config tc;
        gm_lora_config lc;
        const gm_lora_config *lp = part == 0 ? gm_train_vision_selection(&o, &lc).lora : gm_train_audio_selection(&o, &lc);
        for (int l = 0; l < GM_MAX_LAYERS; l++) lc.layers[l] = true;
        gm_status s = part == 0 ? gm_config_vision_tower(&cfg, &tc, &err)
                      : gm_config_has_audio(&cfg) ? gm_config_audio_tower(&cfg, &tc, &err)
                                                  : gm_error_set(&err, GM_ERR_INVALID, "%s has no audio encoder to train "
                                                                 "(audio_targets is for Gemma 3n and Gemma 4 E2B / E4B)", cfg.name);
        if (s == GM_OK)
            s = gm_lora_describe(&lo, lp, gm_arch_get(tc.arch), &tc,
                                 part == 0 ? GM_VISION_TOWER_PREFIX : GM_AUDIO_TOWER_PREFIX, &err);
        if (s != GM_OK) {
            gm_error_prefix(&err, part == 0 ? "vision_targets" : "audio_targets");
            return gm_bind_raise(L, &err);
        }
        lua_pushinteger(L, lo.n);
        lua_pushinteger(L, lo.n_params);
        gm_lora_free(&lo);
    }
    return aud ? 6 : 4;
}

static int l_plan(lua_State *L) {
    gm_train_opts o;
    gm_config cfg;
    gm_dtype stored, stored_embed;
    plan_args(L, &o, &cfg, &stored, &stored_embed);
    gm_error err = {0};
    gm_plan_inputs in = {0, 0};
    /* optional inputs {images = per example}: the planner then also checks that max_length
     * leaves room for text beside them (gm_plan_max_images), as `gemmarun plan images=N` does */
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        static const char *const allowed[] = {"images", "device", NULL};
        gm_bind_check_opts(L, 3, "plan", allowed);
        lua_getfield(L, 3, "images");
        if (!lua_isnil(L, -1) && (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0))
            return luaL_error(L, "plan: inputs.images must be an integer >= 0 (images per example)");
        in.images = (int64_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    /* {device = "cuda"}: the plan placed on a GPU (gm_plan_on_device), its share as field gpu */
    int device_index = -1;
    if (!lua_isnoneornil(L, 3) && lua_getfield(L, 3, "device") != LUA_TNIL) {
        if (gm_backend_parse_device(luaL_checkstring(L, -1), &device_index, &err) != GM_OK) return gm_bind_raise(L, &err);
    }
    if (!lua_isnoneornil(L, 3)) lua_pop(L, 1);
    gm_plan p;
    if (gm_plan_training(&cfg, &o, stored, stored_embed, &in, &p, &err) != GM_OK) return gm_bind_raise(L, &err);
    gm_plan_on_device(&p, device_index >= 0 ? GM_DEVICE_CUDA : GM_DEVICE_CPU);
    lua_createtable(L, 0, GM_MEM_KIND_COUNT + 3);
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
        lua_pushinteger(L, (lua_Integer)p.by_kind[k]);
        lua_setfield(L, -2, gm_mem_kind_name((gm_mem_kind)k));
    }
    lua_pushinteger(L, (lua_Integer)p.runtime);
    lua_setfield(L, -2, "runtime");
    if (p.vision.total > 0) { /* the tower's share, an item apart (gm_plan.h) */
        lua_pushinteger(L, (lua_Integer)p.vision.total);
        lua_setfield(L, -2, "vision tower");
    }
    if (p.audio.total > 0) {
        lua_pushinteger(L, (lua_Integer)p.audio.total);
        lua_setfield(L, -2, "audio tower");
    }
    lua_pushinteger(L, (lua_Integer)p.total);
    lua_setfield(L, -2, "total");
    lua_pushboolean(L, p.exact);
    lua_setfield(L, -2, "exact");
    if (p.device == GM_DEVICE_CUDA) {
        const char *keys[4] = {"arenas", "context", "total", "host"};
        size_t vals[4] = {p.device_arenas, p.cuda_context, p.device_total, p.host_total};
        lua_createtable(L, 0, 4);
        for (int i = 0; i < 4; i++) {
            lua_pushinteger(L, (lua_Integer)vals[i]);
            lua_setfield(L, -2, keys[i]);
        }
        lua_setfield(L, -2, "gpu");
    }
    return 1;
}

static int l_make_results_dir(lua_State *L) {
    const char *p = gm_bind_check_runner_path(L, 1);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", p);
    for (char *c = buf + 1; *c; c++) {
        if (*c != '/') continue;
        *c = '\0';
        mkdir(buf, 0755);
        *c = '/';
    }
    if (mkdir(buf, 0755) != 0 && !(access(buf, W_OK) == 0)) return luaL_error(L, "%s: cannot create the folder", p);
    return 0;
}

static int l_remove_checkpoint(lua_State *L) {
    const char *p = gm_bind_check_runner_path(L, 1);
    size_t n = strlen(p);
    if (n < 8 || strcmp(p + n - 8, ".ckpt.h5") != 0) return luaL_error(L, "%s: only *.ckpt.h5 files can be removed", p);
    unlink(p);
    return 0;
}

/* gm.remove_reproduction(path): removes a trial file of a `gemmarun reproduce` scratch folder
 * (<results>/<name>/reproduce/trial-<id>.h5) and its checkpoint, so that a reproduction starts
 * over; any other path is refused. */
static int l_remove_reproduction(lua_State *L) {
    const char *p = gm_bind_check_runner_path(L, 1);
    size_t n = strlen(p);
    const char *slash = strrchr(p, '/');
    if (!slash || slash - p < 10 || strncmp(slash - 10, "/reproduce", 10) != 0 ||
        strncmp(slash + 1, "trial-", 6) != 0 || n < 3 || strcmp(p + n - 3, ".h5") != 0 ||
        strchr(slash + 7, '.') != p + n - 3)
        return luaL_error(L, "%s: only reproduce/trial-<id>.h5 files can be removed", p);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%.*s.ckpt.h5", (int)(n - 3), p);
    unlink(p);
    unlink(ckpt);
    return 0;
}

static int l_base64(lua_State *L) {
    size_t n = 0;
    const char *s = luaL_checklstring(L, 1, &n);
    if (n > ((size_t)1 << 30)) return luaL_error(L, "gm.base64: %zu bytes: at most 1 GiB", n);
    size_t out_n = 4 * ((n + 2) / 3);
    luaL_Buffer b;
    unsigned char *out = (unsigned char *)luaL_buffinitsize(L, &b, out_n + 1);
    // EVP_EncodeBlock takes an int length: encode in chunks of 3 * 2^20 bytes (no padding inside)
    size_t done = 0, w = 0;
    while (done < n) {
        size_t k = n - done < ((size_t)3 << 20) ? n - done : ((size_t)3 << 20);
        w += (size_t)EVP_EncodeBlock(out + w, (const unsigned char *)s + done, (int)k);
        done += k;
    }
    luaL_pushresultsize(&b, w);
    return 1;
}

static int l_reset_peak_rss(lua_State *L) {
    (void)L;
    gm_process_reset_peak_rss();
    return 0;
}

/* gm.plan_fit(model, opts, limit_bytes) -> opts', plan_total, chosen (raises GM_ERR_LIMIT's
 * message when even checkpointing and batch 1 do not fit) */
static int l_plan_fit(lua_State *L) {
    luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Number limit = luaL_checknumber(L, 3);
    /* the plan command's range; also keeps the size_t conversion below defined */
    if (!(limit >= 1 && limit <= 0x1p60)) luaL_error(L, "plan_fit: limit %f: must be 1 .. 2^60 bytes", (double)limit);
    gm_train_opts o;
    gm_config cfg;
    gm_dtype stored, stored_embed;
    plan_args(L, &o, &cfg, &stored, &stored_embed);
    gm_error err = {0};
    gm_plan_inputs in = {0, 0};
    gm_plan p;
    char chosen[256];
    if (gm_plan_fit(&cfg, &o, stored, stored_embed, &in, (size_t)limit, &p, chosen, sizeof chosen, &err) != GM_OK)
        return gm_bind_raise(L, &err);
    /* a copy of the options table with the fitted fields */
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_settable(L, -4);
    }
    lua_pushboolean(L, o.checkpointing);
    lua_setfield(L, -2, "checkpointing");
    lua_pushinteger(L, o.batch);
    lua_setfield(L, -2, "batch");
    lua_pushinteger(L, o.grad_accum);
    lua_setfield(L, -2, "grad_accum");
    lua_pushinteger(L, o.max_images); /* images per micro-batch shrink with the batch */
    lua_setfield(L, -2, "max_images");
    lua_pushinteger(L, (lua_Integer)p.total);
    lua_pushstring(L, chosen);
    return 3;
}

void gm_lua_open_run(lua_State *L) {
    static const luaL_Reg fns[] = {{"read_text", l_read_text}, {"list_dir", l_list_dir}, {"is_dir", l_is_dir},
                                   {"real_path", l_real_path}, {"file_exists", l_file_exists}, {"sha256", l_sha256}, {"isatty", l_isatty},
                                   {"build_info", l_build_info},
                                   {"progress", l_progress}, {"interrupted", l_interrupted},
                                   {"model_config", l_model_config}, {"lora_count", l_lora_count}, {"train_check", l_train_check}, {"plan", l_plan}, {"plan_fit", l_plan_fit},
                                   {"make_results_dir", l_make_results_dir}, {"remove_checkpoint", l_remove_checkpoint},
                                   {"remove_reproduction", l_remove_reproduction}, {"base64", l_base64},
                                   {"reset_peak_rss", l_reset_peak_rss}, {NULL, NULL}};
    gm_bind_add_functions(L, fns);
}
