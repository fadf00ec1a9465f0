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

/* The OpenMP wait policy gemmarun starts with (a short spin, then threads sleep) is set by
 * gm_kernels_startup (kernels.h), with OpenBLAS's core type, in one re-execution. */

#endif /* GM_OMP_H */
