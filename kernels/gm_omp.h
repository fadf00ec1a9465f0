/*
 * gm_omp.h - OpenMP regions that are skipped, not entered, when they would run on one thread.
 *
 * Why: libgomp allocates a team structure for every parallel region that runs on one thread
 * (an `if (...)` clause that is false, or num_threads(1)) and frees it at the region's end; only
 * teams of two or more threads are cached for the next region (libgomp team.c, gomp_new_team /
 * gomp_team_end: "team->nthreads == 1 ... free_team"). A training step on small shapes enters
 * hundreds of such regions, so "no allocation after the first step" did not hold at the C
 * library's door (tests/unit/test_memory.c counts malloc/mmap there). These macros run the
 * loop or block as plain C when the region would have one thread; the code inside is the same
 * text either way (the macro expands it twice), so the serial and parallel paths cannot drift.
 *
 *   GM_OMP_FOR(nt, cond, clauses, for (...) body)  - `#pragma omp parallel for num_threads(nt)
 *                                                    clauses` when nt > 1 && cond, else the loop
 *   GM_OMP_PARALLEL(nt, cond, { block })           - `#pragma omp parallel num_threads(nt)` the
 *                                                    same way; inside, omp_get_thread_num() is 0
 *                                                    and omp_get_num_threads() 1 when serial,
 *                                                    and an orphaned `#pragma omp for` runs the
 *                                                    whole range
 * `nt` and `cond` are evaluated once. The loop/block is the last (variadic) argument so that
 * commas inside it need no parentheses. A directive inside that argument (a work-sharing
 * `omp for` in a GM_OMP_PARALLEL block) must be written GM_PRAGMA(omp for ...): a `#pragma` line
 * cannot stand inside a macro's argument (C11 6.10.3p11).
 */
#ifndef GM_OMP_H
#define GM_OMP_H

/* a pragma from inside a macro (C11 6.10.9) */
#define GM_PRAGMA(x) _Pragma(#x)

#define GM_OMP_FOR(nt, cond, clauses, ...)                                        \
    do {                                                                          \
        const int gm_omp_nt_ = (cond) ? (int)(nt) : 1;                            \
        if (gm_omp_nt_ > 1) {                                                     \
            GM_PRAGMA(omp parallel for num_threads(gm_omp_nt_) clauses)     \
            __VA_ARGS__                                                           \
        } else {                                                                  \
            __VA_ARGS__                                                           \
        }                                                                         \
    } while (0)

#define GM_OMP_PARALLEL(nt, cond, ...)                                            \
    do {                                                                          \
        const int gm_omp_nt_ = (cond) ? (int)(nt) : 1;                            \
        if (gm_omp_nt_ > 1) {                                                     \
            GM_PRAGMA(omp parallel num_threads(gm_omp_nt_))                  \
            __VA_ARGS__                                                           \
        } else {                                                                  \
            __VA_ARGS__                                                           \
        }                                                                         \
    } while (0)

/*
 * gm_omp_passive_wait_by_default(argv) - first thing in an executable's main(): OpenMP threads that
 * wait at a barrier sleep (futex) instead of spinning, unless the user set OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT. Returns only if nothing had to change or the re-execution failed (then waits
 * spin as before: slower beside busy processes, never wrong).
 *
 * Why: libgomp's default spins up to 300,000 iterations before sleeping. When another process
 * holds a core, the thread that finished its share spins on the CPU the unfinished one needs,
 * every parallel region waits for a descheduled thread, and a training step of the 270M went from
 * 4.75 s to 18.0 s beside one busy process (3.8x); with passive waits 3.99 s to 8.80 s (2.2x; the
 * fair share of 2 cores among 3 busy threads is 1.5x), and the quiet machine is no slower
 * (tests/bench/bench_busy.sh, one run, 2026-12-04; docs/benchmarks.md).
 * How: libgomp reads its environment once, in its constructor, before main() runs, and has no
 * call to change the policy later. Setting the variable from the executable's .preinit_array does
 * not work with glibc (libc's own start-up then resets environ to the original block), so the
 * process sets it and re-executes itself (/proc/self/exe, same argv: one more exec at start-up). Children (sbatch,
 * MPI ranks) inherit it.
 */
#include <stdlib.h>
#include <unistd.h>
static inline void gm_omp_passive_wait_by_default(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
    execv("/proc/self/exe", argv);
}

#endif /* GM_OMP_H */
