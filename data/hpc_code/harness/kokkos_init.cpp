/* Kokkos start-up for the runner of Kokkos problems (main_run_omp.c built with -DHPC_KOKKOS; trusted).
 *
 * Kokkos is initialised before the timed window opens, with the host backend's default thread count
 * (OMP_NUM_THREADS for the OpenMP backend), so the candidate's function finds it ready, as ParEval's
 * Kokkos drivers do; the candidate's library links the same libkokkoscore, so it shares this instance.
 */
#include <Kokkos_Core.hpp>

extern "C" void hpc_kokkos_init(void) { Kokkos::initialize(); }

/* How many threads a parallel_for on the host gets: 1 with the Serial backend. */
extern "C" int hpc_kokkos_workers(void) { return Kokkos::DefaultHostExecutionSpace::concurrency(); }

extern "C" void hpc_kokkos_finalize(void) { Kokkos::finalize(); }
