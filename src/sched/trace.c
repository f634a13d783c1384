/* Chrome trace-event writer: events are streamed through a stdio buffer to
 * a temporary file and the file is renamed into place at close. */
#include "strata/trace.h"

#include "strata/file.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The one process every lane belongs to. */
#define ST_TRACE_PID 1
/* stdio buffer: large enough that a write(2) happens every few thousand
 * events, not per event. */
#define ST_TRACE_BUF_BYTES (1u << 20)

struct st_trace {
	pthread_mutex_t mu;
	FILE *fp;           /* over file.fd, which it owns */
	struct st_file_atomic file;
	char *buf;          /* ST_TRACE_BUF_BYTES, fp's buffer */
	uint64_t origin_ns; /* st_now_ns() at creation: ts 0 */
	int n_lanes;
	bool any_event;     /* an event was written: the next needs a comma */
};

/* name as a JSON string, quotes included. Control bytes as \u00XX; bytes
 * from 0x80 pass through (names are UTF-8). */
static void trace_put_str(FILE *fp, const char *s)
{
	putc('"', fp);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			putc('\\', fp);
			putc(c, fp);
		} else if (c < 0x20 || c == 0x7f) {
			fprintf(fp, "\\u%04x", c);
		} else {
			putc(c, fp);
		}
	}
	putc('"', fp);
}

/* Microseconds since the origin with three decimals (exact nanoseconds). */
static void trace_put_us(FILE *fp, uint64_t ns)
{
	fprintf(fp, "%llu.%03u", (unsigned long long)(ns / 1000),
		(unsigned)(ns % 1000));
}

static uint64_t trace_rel(const struct st_trace *t, uint64_t ns)
{
	return ns > t->origin_ns ? ns - t->origin_ns : 0;
}

/* Separator and the fields every event has; caller holds mu. */
static void trace_begin_event(struct st_trace *t, const char *ph,
			      const char *name)
{
	fputs(t->any_event ? ",\n{" : "\n{", t->fp);
	t->any_event = true;
	fprintf(t->fp, "\"ph\":\"%s\",\"pid\":%d,\"name\":", ph, ST_TRACE_PID);
	trace_put_str(t->fp, name);
}

/* Closes the stream (if any) and removes the temporary (if any). */
static void trace_free(struct st_trace *t)
{
	if (t->fp) {
		fclose(t->fp);
		t->file.fd = -1; /* closed with the stream */
	}
	st_file_atomic_abort(&t->file);
	pthread_mutex_destroy(&t->mu);
	free(t->buf);
	free(t);
}

int st_trace_create(struct st_trace **out, const char *path)
{
	struct st_trace *t;
	int err;

	*out = NULL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	t->file.fd = -1;
	pthread_mutex_init(&t->mu, NULL);
	t->buf = malloc(ST_TRACE_BUF_BYTES);
	if (!t->buf) {
		trace_free(t);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	err = st_file_atomic_open(&t->file, path);
	if (err) {
		trace_free(t);
		return err;
	}
	t->fp = fdopen(t->file.fd, "w");
	if (!t->fp) {
		err = -errno;
		st_error_set(err, "%s: %s", t->file.tmp_path, strerror(-err));
		trace_free(t);
		return err;
	}
	setvbuf(t->fp, t->buf, _IOFBF, ST_TRACE_BUF_BYTES);
	t->origin_ns = st_now_ns();
	fputs("{\"traceEvents\":[", t->fp);
	trace_begin_event(t, "M", "process_name");
	fputs(",\"args\":{\"name\":\"strata\"}}", t->fp);
	*out = t;
	return 0;
}

int st_trace_lane(struct st_trace *t, const char *name)
{
	int id;

	if (!t)
		return 0;
	pthread_mutex_lock(&t->mu);
	id = ++t->n_lanes;
	trace_begin_event(t, "M", "thread_name");
	fprintf(t->fp, ",\"tid\":%d,\"args\":{\"name\":", id);
	trace_put_str(t->fp, name);
	fputs("}}", t->fp);
	/* Lanes in the order they were made, not by name. */
	trace_begin_event(t, "M", "thread_sort_index");
	fprintf(t->fp, ",\"tid\":%d,\"args\":{\"sort_index\":%d}}", id, id);
	pthread_mutex_unlock(&t->mu);
	return id;
}

void st_trace_span(struct st_trace *t, int lane, const char *name,
		   uint64_t t0_ns, uint64_t t1_ns, const char *args_json)
{
	uint64_t ts, end;

	if (!t)
		return;
	ts = trace_rel(t, t0_ns);
	end = trace_rel(t, t1_ns);
	pthread_mutex_lock(&t->mu);
	trace_begin_event(t, "X", name);
	fprintf(t->fp, ",\"tid\":%d,\"ts\":", lane);
	trace_put_us(t->fp, ts);
	fputs(",\"dur\":", t->fp);
	trace_put_us(t->fp, end > ts ? end - ts : 0);
	if (args_json) {
		fputs(",\"args\":", t->fp);
		fputs(args_json, t->fp);
	}
	putc('}', t->fp);
	pthread_mutex_unlock(&t->mu);
}

uint64_t st_trace_origin_ns(const struct st_trace *t)
{
	return t ? t->origin_ns : 0;
}

void st_trace_instant(struct st_trace *t, int lane, const char *name,
		      uint64_t t_ns)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	trace_begin_event(t, "i", name);
	fprintf(t->fp, ",\"tid\":%d,\"s\":\"t\",\"ts\":", lane);
	trace_put_us(t->fp, trace_rel(t, t_ns));
	putc('}', t->fp);
	pthread_mutex_unlock(&t->mu);
}

void st_trace_counter(struct st_trace *t, const char *name, uint64_t t_ns,
		      double value)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	trace_begin_event(t, "C", name);
	fputs(",\"ts\":", t->fp);
	trace_put_us(t->fp, trace_rel(t, t_ns));
	/* %.17g round-trips a double; NaN and infinities are not JSON. */
	if (value != value || value > 1e308 || value < -1e308)
		value = 0;
	fprintf(t->fp, ",\"args\":{\"value\":%.17g}}", value);
	pthread_mutex_unlock(&t->mu);
}

int st_trace_close(struct st_trace *t)
{
	FILE *fp;
	int err = 0;

	if (!t)
		return 0;
	fp = t->fp;
	t->fp = NULL;
	fputs("\n],\"displayTimeUnit\":\"ms\"}\n", fp);
	errno = 0;
	if (fflush(fp) != 0 || ferror(fp)) {
		/* A failure seen by an earlier buffered write left only the
		 * error flag: report it as EIO. */
		err = -(errno ? errno : EIO);
		st_error_set(err, "%s: write: %s", t->file.tmp_path,
			     strerror(-err));
	} else if (fsync(fileno(fp)) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync: %s", t->file.tmp_path,
			     strerror(-err));
	}
	if (fclose(fp) != 0 && !err) {
		err = -errno;
		st_error_set(err, "%s: close: %s", t->file.tmp_path,
			     strerror(-err));
	}
	t->file.fd = -1; /* closed with the stream */
	/* publish finishes t->file, renamed or not; after an earlier failure
	 * trace_free() removes the temporary. */
	if (!err)
		err = st_file_atomic_publish(&t->file);
	trace_free(t);
	return err;
}

void st_trace_abort(struct st_trace *t)
{
	if (t)
		trace_free(t);
}
