/* pathprof doctor's capability probes: one tiny program per attach type pathprof relies on. */
#ifndef PATHPROF_DOCTOR_H
#define PATHPROF_DOCTOR_H
struct pp_doctor_hits { __u64 hits; };
#endif
