/* strata: a Chrome trace-event writer (`strata train --trace FILE`).
 *
 * The file is the JSON object format of the Trace Event Format, which
 * Perfetto (ui.perfetto.dev) and chrome://tracing open:
 *   {"traceEvents":[ ...events... ],"displayTimeUnit":"ms"}
 * Everything lives in one process, "strata" (pid 1). Each lane is a thread
 * of that process (tid = lane id, named by a thread_name metadata event and
 * sorted in creation order): one lane per queue, e.g. compute, h2d, d2h,
 * nvme, cpu-adam. Spans are complete events ("ph":"X"), counters are "C"
 * events, instants "i" events. Timestamps come in st_now_ns() nanoseconds
 * and are written in microseconds with three decimals, relative to the
 * trace's creation.
 *
 * Events are streamed to a temporary file next to the target as they come
 * (through a stdio buffer), so a long run holds no events in memory;
 * st_trace_close() finishes the JSON, fsyncs and renames it over the target,
 * so the target is never a half-written trace.
 *
 * Thread-safe: every function may be called from any thread (one mutex).
 * Every function accepts t == NULL and then does nothing, so callers trace
 * unconditionally through a pointer that is NULL when tracing is off. */
#ifndef STRATA_TRACE_H
#define STRATA_TRACE_H

#include "strata/common.h"

#include <stdint.h>

struct st_trace;

/* Start a trace that st_trace_close() will write to path. Creates
 * "<path>.tmp.XXXXXX" in path's directory now (so a bad path fails before
 * training starts) and names process 1 "strata". The time origin is now.
 * Returns 0 and sets *out, or -errno (the detail names the file). */
int st_trace_create(struct st_trace **out, const char *path);

/* Add a lane called name (copied; JSON-escaped on output). Returns its id,
 * >= 1, to pass to st_trace_span(); 0 when t is NULL; -ENOMEM. */
int st_trace_lane(struct st_trace *t, const char *name);

/* Record that name ran on lane from t0_ns to t1_ns (st_now_ns() clock; a
 * start before the trace's origin is clamped to it, an end before the start
 * gives a zero duration). args_json, when not NULL, is a JSON object's text
 * (e.g. "{\"bytes\":4096}") copied verbatim as the event's "args": the
 * caller guarantees it is valid JSON. name is escaped. */
void st_trace_span(struct st_trace *t, int lane, const char *name,
		   uint64_t t0_ns, uint64_t t1_ns, const char *args_json);

/* The trace's time origin (st_now_ns() at creation; ts 0), for a time
 * written in an event's args; 0 when t is NULL. */
uint64_t st_trace_origin_ns(const struct st_trace *t);

/* Record an instant (a marker, e.g. "step 12") on lane at t_ns. */
void st_trace_instant(struct st_trace *t, int lane, const char *name,
		      uint64_t t_ns);

/* Set counter name (e.g. "host bytes in use") to value from t_ns on: a
 * counter track of process "strata" with one series, "value". Values are
 * written exactly up to 2^53. */
void st_trace_counter(struct st_trace *t, const char *name, uint64_t t_ns,
		      double value);

/* Finish the JSON, flush, fsync, rename over the path given at creation,
 * fsync the directory, and free t. Call it once no other thread can still
 * record into t. On any failure (including a write error
 * seen earlier) the temporary is removed, the target keeps its old
 * contents, and t is freed all the same. Returns 0 (also for t == NULL) or
 * -errno with the detail. */
int st_trace_close(struct st_trace *t);

/* Remove the temporary without writing the target, and free t. NULL does
 * nothing. */
void st_trace_abort(struct st_trace *t);

#endif
