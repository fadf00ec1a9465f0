/*
 * bind_proc.c - processes and locks for the runner and the scheduler front end:
 *
 *   gm.file_lock(path [, wait_s]) -> true | false, holder
 *                                                 an exclusive lock on the file path (created if
 *                                                 missing), held until gm.file_unlock(path) or the
 *                                                 process ends; false when another process holds it
 *                                                 past wait_s seconds (default 0; tried every 20 ms)
 *                                                 (holder: "PID on HOST" as it wrote there, or "?")
 *   gm.file_unlock(path)                          lets it go
 *   gm.file_locked(path) -> false | true, holder  whether another process holds it now; creates
 *                                                 nothing (no file: nobody ever locked it)
 *   gm_lua_spawn (not in gm: lua/main.c hands it to `gemmarun submit` only, lua/slurm.lua)
 *       spawn({program, arg, ...}) -> exit_code, stdout, stderr
 *
 * Why a lock: a trial is one results file and one checkpoint, written as it trains. Two processes
 * on the same trial - a second `gemmarun` on the same experiment, or an array task resubmitted
 * while the first still runs - would interleave their writes. flock(2) locks are released by
 * the kernel when the process dies, however it dies (kill -9, a node lost with its NFS client
 * aside), so a stale lock cannot block a resubmission. On NFS, Linux emulates flock with
 * byte-range locks the server arbitrates (flock(2), NOTES), so tasks on different nodes see
 * each other's locks.
 *
 * Why spawn is not in gm: experiment files are sandboxed (lua/gm_lua.c) and see a copy of gm;
 * running programs is what --allow-os alone grants them. spawn runs the program directly
 * (posix_spawnp, no shell: nothing in the arguments is interpreted), waits for it and returns
 * what it printed; output past 1 MiB per stream is dropped (sbatch prints a line).
 *
 * Errors: a path that cannot be opened or locked for a reason other than another holder raises
 * a Lua error naming it; spawn raises when the program cannot be started (not found: the message
 * says so).
 */
#define _GNU_SOURCE
#include "bind_util.h"
#include "gm_lua.h"
#include "write_rule.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- trial locks: path -> fd, for the few trials one process holds ---- */
#define MAX_LOCKS 64
static struct {
    char path[4096];
    int fd;
} locks[MAX_LOCKS];

/* Tries LOCK_EX on fd for wait_s seconds; 0 when locked, else the errno of the last try. */
static int lock_within(int fd, double wait_s) {
    for (double waited = 0;; waited += 0.02) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK || waited >= wait_s) return errno;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The holder's note in the lock file ("PID on HOST"), or "?". */
static void read_holder(int fd, char *holder, size_t n) {
    ssize_t k = pread(fd, holder, n - 1, 0);
    holder[k > 0 ? k : 0] = '\0';
    holder[strcspn(holder, "\n")] = '\0';
    if (!holder[0]) snprintf(holder, n, "?");
}

static int l_file_lock(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    double wait_s = luaL_optnumber(L, 2, 0);
    gm_bind_check_write_path(L, path, "file_lock"); /* the results folder only, like every write */
    for (int i = 0; i < MAX_LOCKS; i++)
        if (locks[i].fd > 0 && strcmp(locks[i].path, path) == 0) {
            lua_pushboolean(L, 1);
            return 1;
        }
    int slot = -1;
    for (int i = 0; i < MAX_LOCKS && slot < 0; i++)
        if (locks[i].fd <= 0) slot = i;
    if (slot < 0) return luaL_error(L, "file_lock: more than %d locks held at once", MAX_LOCKS);
    if (strlen(path) >= sizeof locks[0].path) return luaL_error(L, "file_lock: path too long: %s", path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return luaL_error(L, "cannot open the lock file %s: %s", path, strerror(errno));
    int e = lock_within(fd, wait_s);
    if (e != 0) {
        char holder[300];
        read_holder(fd, holder, sizeof holder);
        close(fd);
        if (e != EWOULDBLOCK) return luaL_error(L, "cannot lock %s: %s", path, strerror(e));
        lua_pushboolean(L, 0);
        lua_pushstring(L, holder);
        return 2;
    }
    /* the holder's pid and host, for the message another process gives (a hint only) */
    char who[300], host[256] = "";
    gethostname(host, sizeof host - 1);
    int n = snprintf(who, sizeof who, "%ld on %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) == 0 && pwrite(fd, who, (size_t)n, 0) < 0) { /* the hint is optional */ }
    snprintf(locks[slot].path, sizeof locks[slot].path, "%s", path);
    locks[slot].fd = fd;
    lua_pushboolean(L, 1);
    return 1;
}

static int l_file_unlock(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    for (int i = 0; i < MAX_LOCKS; i++)
        if (locks[i].fd > 0 && strcmp(locks[i].path, path) == 0) {
            close(locks[i].fd); /* closing the last descriptor releases the flock */
            locks[i].fd = 0;
        }
    return 0;
}

static int l_file_locked(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            lua_pushboolean(L, 0);
            return 1;
        }
        return luaL_error(L, "cannot open the lock file %s: %s", path, strerror(errno));
    }
    /* a shared lock: it is refused only while someone holds the exclusive one */
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        close(fd);
        lua_pushboolean(L, 0);
        return 1;
    }
    char holder[300];
    read_holder(fd, holder, sizeof holder);
    close(fd);
    lua_pushboolean(L, 1);
    lua_pushstring(L, holder);
    return 2;
}

/* ---- spawn ---- */
#define SPAWN_MAX_OUT (1 << 20)

typedef struct {
    char *buf;
    size_t len, cap;
} outbuf;

static void out_add(outbuf *o, const char *p, size_t n) {
    if (o->len + n > SPAWN_MAX_OUT) n = SPAWN_MAX_OUT - o->len;
    if (n == 0) return;
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 4096;
        while (cap < o->len + n) cap *= 2;
        char *b = realloc(o->buf, cap);
        if (!b) return; /* out of memory: the rest of the output is dropped, not the run */
        o->buf = b, o->cap = cap;
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
}

int gm_lua_spawn(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    int argc = (int)luaL_len(L, 1);
    if (argc < 1 || argc > 1000) return luaL_error(L, "spawn: give {program, arg, ...}");
    char **argv = lua_newuserdatauv(L, sizeof(char *) * (size_t)(argc + 1), 0); /* freed with the state */
    for (int i = 0; i < argc; i++) {
        lua_rawgeti(L, 1, i + 1);
        argv[i] = (char *)luaL_checkstring(L, -1); /* kept alive by the table at index 1 */
        lua_pop(L, 1);
    }
    argv[argc] = NULL;
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (po[i] >= 0) close(po[i]);
            if (pe[i] >= 0) close(pe[i]);
        }
        return luaL_error(L, "spawn %s: pipe: %s", argv[0], strerror(e));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    /* the child gets the default SIGINT / SIGTERM handling, not ours */
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(po[1]);
    close(pe[1]);
    if (rc != 0) {
        close(po[0]);
        close(pe[0]);
        return luaL_error(L, "cannot run %s: %s%s", argv[0], strerror(rc),
                          rc == ENOENT ? " (not on PATH: is this a machine with the scheduler's commands?)" : "");
    }
    outbuf out = {0}, err = {0};
    struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
    int open_fds = 2;
    char chunk[4096];
    while (open_fds > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(fds[i].fd, chunk, sizeof chunk);
            if (n > 0) out_add(i == 0 ? &out : &err, chunk, (size_t)n);
            else if (n == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    lua_pushinteger(L, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    lua_pushlstring(L, out.buf ? out.buf : "", out.len);
    lua_pushlstring(L, err.buf ? err.buf : "", err.len);
    free(out.buf);
    free(err.buf);
    return 3;
}

void gm_lua_open_proc(lua_State *L) {
    static const luaL_Reg fns[] = {
        {"file_lock", l_file_lock}, {"file_unlock", l_file_unlock}, {"file_locked", l_file_locked}, {NULL, NULL}};
    gm_bind_add_functions(L, fns);
}
