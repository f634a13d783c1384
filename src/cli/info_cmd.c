/* strata: `strata info`, what strata finds before a run: on this machine
 * (the build, the CPU and the AdamW kernel it picks, memory, huge pages and
 * the locked-memory limit, NUMA, the GPU or why there is none, io_uring),
 * in the --nvme directories (each probed with the nvme tier itself: a
 * write and a read back through io_uring), and in a checkpoint directory
 * (--ckpt: what --resume would take, every step-N there, --verify their
 * sizes and XXH64). Text, or --json. Exit 2 for bad input, 1 when a probe
 * or a checkpoint fails. */
#include "cli.h"
#include "strata/ckpt.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/io.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/tier.h"
#include "strata/tokenizer.h"
#include "strata/weights.h"
#ifdef ST_HAVE_CUDA
#include "strata/cuda.h"
#endif

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <liburing.h>
#include <math.h>
#include <mntent.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#define PROBE_BYTES (1u << 20) /* what the nvme probe writes and reads back */

static void info_usage(FILE *f)
{
	fprintf(f,
"usage: strata info [--nvme DIR[,DIR...]] [--json]\n"
"       strata info --ckpt PATH [--verify] [--json]\n"
"\n"
"What strata finds on this machine: the build, the CPU and the AdamW kernel it\n"
"picks, memory, huge pages, the locked-memory limit (the host tier's pinned\n"
"memory without a GPU), NUMA, the GPU (or why there is none), io_uring.\n"
"  --nvme DIR[,DIR...]  also each directory's file system and free space, and\n"
"                       whether the nvme tier works there: it writes 1 MiB and\n"
"                       reads it back through io_uring, with O_DIRECT or, where\n"
"                       the file system refuses it, buffered (nothing is left)\n"
"\n"
"With --ckpt, a checkpoint directory instead (a --save DIR or one step-N in\n"
"it): the checkpoint --resume DIR would take, with its step, architecture,\n"
"model, weights (parameters, tensors, dtypes, shards), training config and\n"
"files, and every step-N directory there. Other weights (a Hugging Face\n"
"directory, one model.safetensors or shards with model.safetensors.index.json;\n"
"a model.safetensors file; an llm.c model file): what they are, the\n"
"architecture and model, whether every tensor of it is there with its shape,\n"
"and the files: values, tensors and dtypes, each shard with its size.\n"
"  --verify             check each listed checkpoint's files: size and XXH64;\n"
"                       other weights: read every tensor, every value finite\n"
"\n"
"  --json               the same as one JSON object\n"
"  -h, --help\n"
"Exit status: 0 (a machine without a GPU or io_uring too); 1 when an --nvme\n"
"probe fails or a listed checkpoint is damaged; 2 for bad input (a flag, a\n"
"missing directory, no checkpoint there).\n");
}

/* json-c helpers: add a value to an object */
static void put_str(struct json_object *o, const char *k, const char *v)
{
	json_object_object_add(o, k, v ? json_object_new_string(v) : NULL);
}

static void put_int(struct json_object *o, const char *k, int64_t v)
{
	json_object_object_add(o, k, json_object_new_int64(v));
}

static void put_bool(struct json_object *o, const char *k, bool v)
{
	json_object_object_add(o, k, json_object_new_boolean(v));
}

/* --- the machine --------------------------------------------------------- */

/* First "key : value" line of /proc/cpuinfo with key, into buf. */
static void cpuinfo_field(const char *key, char *buf, size_t n)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	size_t klen = strlen(key);

	snprintf(buf, n, "unknown");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		if (strncmp(line, key, klen) != 0 || !colon)
			continue;
		colon++;
		colon += strspn(colon, " \t");
		colon[strcspn(colon, "\n")] = '\0';
		snprintf(buf, n, "%s", colon);
		break;
	}
	fclose(f);
}

/* A /proc/meminfo value ("MemTotal:  24000 kB"), in its unit times mult;
 * -1 when absent. */
static int64_t meminfo(const char *key, int64_t mult)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	size_t klen = strlen(key);
	int64_t v = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
			v = strtoll(line + klen + 1, NULL, 10) * mult;
			break;
		}
	fclose(f);
	return v;
}

/* The [chosen] word of a sysfs choice file ("always [madvise] never"). */
static void sysfs_choice(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "r");
	char line[256], *a, *b;

	snprintf(buf, n, "unknown");
	if (!f)
		return;
	if (fgets(line, sizeof(line), f) && (a = strchr(line, '[')) && (b = strchr(a, ']'))) {
		*b = '\0';
		snprintf(buf, n, "%s", a + 1);
	}
	fclose(f);
}

/* Whether this process may lock any amount of memory (CAP_IPC_LOCK, bit
 * 14 of /proc/self/status's CapEff). */
static bool cap_ipc_lock(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	bool yes = false;

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "CapEff:", 7) == 0) {
			yes = (strtoull(line + 7, NULL, 16) >> 14) & 1;
			break;
		}
	fclose(f);
	return yes;
}

static struct json_object *limit_json(rlim_t v)
{
	return v == RLIM_INFINITY ? json_object_new_string("unlimited")
				  : json_object_new_int64((int64_t)v);
}

static const char *limit_text(rlim_t v, char *buf, size_t n)
{
	return v == RLIM_INFINITY ? "unlimited" : st_format_bytes((uint64_t)v, buf, n);
}

static struct json_object *machine_json(void)
{
	struct json_object *o = json_object_new_object(), *s;
	char buf[512];
	cpu_set_t set;
	struct rlimit rl;
	struct utsname un;
	struct io_uring ring;
	int ret;

	snprintf(buf, sizeof(buf), "%d.%d", ST_VERSION_MAJOR, ST_VERSION_MINOR);
	put_str(o, "version", buf);
	put_str(o, "devices", st_device_list());

	s = json_object_new_object();
	cpuinfo_field("model name", buf, sizeof(buf));
	put_str(s, "model", buf);
	put_int(s, "online", sysconf(_SC_NPROCESSORS_ONLN));
	put_int(s, "usable", sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : -1);
	put_int(s, "omp_threads", omp_get_max_threads());
	put_str(s, "adam", st_optim_path_name(st_optim_path_get()));
	snprintf(buf, sizeof(buf), "%s", openblas_get_config());
	buf[strcspn(buf, "\n")] = '\0';
	put_str(s, "blas", buf);
	json_object_object_add(o, "cpu", s);

	s = json_object_new_object();
	put_int(s, "total_bytes", meminfo("MemTotal", 1024));
	put_int(s, "available_bytes", meminfo("MemAvailable", 1024));
	put_int(s, "hugepage_bytes", meminfo("Hugepagesize", 1024));
	put_int(s, "hugepages_total", meminfo("HugePages_Total", 1));
	put_int(s, "hugepages_free", meminfo("HugePages_Free", 1));
	sysfs_choice("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof(buf));
	put_str(s, "transparent_hugepages", buf);
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		json_object_object_add(s, "memlock_soft", limit_json(rl.rlim_cur));
		json_object_object_add(s, "memlock_hard", limit_json(rl.rlim_max));
	}
	put_bool(s, "cap_ipc_lock", cap_ipc_lock());
	json_object_object_add(o, "memory", s);

	s = json_object_new_object();
	put_int(s, "nodes", st_hwloc_numa_count());
	put_int(s, "self", st_hwloc_numa_of_self());
	json_object_object_add(o, "numa", s);

	s = json_object_new_object();
#ifdef ST_HAVE_CUDA
	{
		struct st_cuda_info ci;
		const char *so;

		put_bool(s, "built", true);
		/* loaded on first use: what a cuda context would find */
		if (st_cuda_blas_load(&so) == 0)
			put_str(s, "cublaslt", so);
		else
			put_str(s, "cublaslt_error", st_error_last());
		ret = st_cuda_info(0, &ci);
		put_int(s, "count", ci.count);
		put_int(s, "runtime_version", ci.runtime_version);
		put_int(s, "driver_version", ci.driver_version);
		if (ret < 0) {
			put_str(s, "error", st_error_last());
		} else {
			put_str(s, "name", ci.name);
			snprintf(buf, sizeof(buf), "%d.%d", ci.cc_major, ci.cc_minor);
			put_str(s, "compute_capability", buf);
			put_int(s, "sms", ci.sm_count);
			put_int(s, "total_bytes", (int64_t)ci.total_bytes);
			put_int(s, "free_bytes", (int64_t)ci.free_bytes);
			put_str(s, "pci", ci.busid);
			put_int(s, "numa_node", ci.numa_node);
		}
	}
#else
	put_bool(s, "built", false);
	put_int(s, "count", 0);
	put_str(s, "error", "built without CUDA (no nvcc when strata was configured)");
#endif
	json_object_object_add(o, "gpu", s);

	s = json_object_new_object();
	if (uname(&un) == 0)
		put_str(s, "kernel", un.release);
	ret = io_uring_queue_init(8, &ring, 0);
	put_bool(s, "ok", ret == 0);
	if (ret == 0)
		io_uring_queue_exit(&ring);
	else
		put_str(s, "error", strerror(-ret));
	json_object_object_add(o, "io_uring", s);
	/* the comm backends built, their libraries (MPI, NCCL) and the world
	 * the launcher gives this process (docs/zero.md) */
	{
		char line[1024];

		put_str(o, "comm", st_comm_describe(line, sizeof(line)));
	}
	return o;
}

/* The file system type of the mount that holds path (longest mount point
 * that is a prefix of its real path). */
static void fs_type(const char *path, char *buf, size_t n)
{
	char *real = realpath(path, NULL);
	FILE *f = setmntent("/proc/self/mounts", "r");
	struct mntent *m;
	size_t best = 0;

	snprintf(buf, n, "unknown");
	if (real && f)
		while ((m = getmntent(f))) {
			size_t len = strlen(m->mnt_dir);
			bool under = strncmp(real, m->mnt_dir, len) == 0 &&
				     (real[len] == '/' || real[len] == '\0' || len == 1);

			if (under && len >= best) {
				best = len;
				snprintf(buf, n, "%s", m->mnt_type);
			}
		}
	if (f)
		endmntent(f);
	free(real);
}

/* The nvme tier on dir: open with a budget of one probe, write a pattern,
 * read it back into another buffer, compare. The tier unlinks its file as
 * soon as it is made, so nothing is left however this ends. */
static struct json_object *probe_dir(const char *dir)
{
	struct json_object *o = json_object_new_object();
	struct st_tier_config cfg = { .budget_bytes = PROBE_BYTES, .dirs = dir };
	struct st_tier *t = NULL;
	struct st_extent ext;
	struct statvfs sv;
	uint8_t *wbuf = NULL, *rbuf = NULL;
	char fs[64];
	int ret;

	put_str(o, "dir", dir);
	fs_type(dir, fs, sizeof(fs));
	put_str(o, "fs", fs);
	if (statvfs(dir, &sv) == 0)
		put_int(o, "free_bytes", (int64_t)((uint64_t)sv.f_bavail * sv.f_frsize));
	if (posix_memalign((void **)&wbuf, ST_PAGE_BYTES, PROBE_BYTES) ||
	    posix_memalign((void **)&rbuf, ST_PAGE_BYTES, PROBE_BYTES)) {
		ret = st_error_set(-ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < PROBE_BYTES; i++)
		wbuf[i] = (uint8_t)(i * 131 + (i >> 12));
	memset(rbuf, 0, PROBE_BYTES);
	ret = st_tier_create(&st_tier_nvme_ops, &cfg, &t);
	if (ret == 0) {
		put_str(o, "tier", st_tier_describe(t));
		ret = st_tier_alloc(t, PROBE_BYTES, &ext);
	}
	if (ret == 0)
		ret = st_tier_write_sync(t, &ext, 0, wbuf, PROBE_BYTES);
	if (ret == 0)
		ret = st_tier_read_sync(t, &ext, 0, rbuf, PROBE_BYTES);
	if (ret < 0 && !strstr(st_error_last(), dir))
		st_error_set(ret, "%s: %s", dir, st_error_last());
	else if (ret == 0 && memcmp(wbuf, rbuf, PROBE_BYTES) != 0)
		ret = st_error_set(-EIO, "%s: the bytes read back differ from those written", dir);
out:
	put_bool(o, "ok", ret == 0);
	if (ret < 0)
		put_str(o, "error", st_error_last());
	st_tier_destroy(t);
	free(wbuf);
	free(rbuf);
	return o;
}

static const char *jstr(struct json_object *o, const char *k)
{
	struct json_object *v;

	return json_object_object_get_ex(o, k, &v) && v ? json_object_get_string(v) : NULL;
}

static int64_t jint(struct json_object *o, const char *k)
{
	struct json_object *v;

	return json_object_object_get_ex(o, k, &v) && v ? json_object_get_int64(v) : -1;
}

static struct json_object *jobj(struct json_object *o, const char *k)
{
	struct json_object *v = NULL;

	json_object_object_get_ex(o, k, &v);
	return v;
}

static const char *bytes_or_unknown(int64_t v, char *buf, size_t n)
{
	return v < 0 ? "unknown" : st_format_bytes((uint64_t)v, buf, n);
}

static void print_machine(struct json_object *m)
{
	struct json_object *cpu = jobj(m, "cpu"), *mem = jobj(m, "memory"),
			   *numa = jobj(m, "numa"), *gpu = jobj(m, "gpu"), *ur = jobj(m, "io_uring");
	char a[32], b[32], c[32];
	struct rlimit rl;

	printf("strata %s, devices %s\n", jstr(m, "version"), jstr(m, "devices"));
	printf("cpu       %s: %lld online, %lld usable here, %lld OpenMP threads; AdamW %s\n",
	       jstr(cpu, "model"), (long long)jint(cpu, "online"), (long long)jint(cpu, "usable"),
	       (long long)jint(cpu, "omp_threads"), jstr(cpu, "adam"));
	printf("blas      %s\n", jstr(cpu, "blas"));
	printf("memory    %s, %s available; huge pages: transparent [%s], %lld of %lld %s pages free\n",
	       bytes_or_unknown(jint(mem, "total_bytes"), a, sizeof(a)),
	       bytes_or_unknown(jint(mem, "available_bytes"), b, sizeof(b)),
	       jstr(mem, "transparent_hugepages"), (long long)jint(mem, "hugepages_free"),
	       (long long)jint(mem, "hugepages_total"),
	       bytes_or_unknown(jint(mem, "hugepage_bytes"), c, sizeof(c)));
	/* the host tier's pinned memory without a GPU: mlock (tiers/host.c) */
	if (json_object_get_boolean(jobj(mem, "cap_ipc_lock")))
		printf("          locked memory: CAP_IPC_LOCK, so the host tier can lock any budget\n");
	else if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_max != RLIM_INFINITY)
		printf("          locked memory: limit %s (hard %s); without a GPU to pin it, a host\n"
		       "          tier whose budget, rounded up to 2 MiB pages, passes %s (less what\n"
		       "          else the process locks) stays pageable: same numbers, slower copies\n",
		       limit_text(rl.rlim_cur, a, sizeof(a)), limit_text(rl.rlim_max, b, sizeof(b)), b);
	else
		printf("          locked memory: no limit, so the host tier can lock any budget\n");
	if (jint(numa, "self") >= 0)
		printf("numa      %lld node%s; this process runs on node %lld\n",
		       (long long)jint(numa, "nodes"), jint(numa, "nodes") == 1 ? "" : "s",
		       (long long)jint(numa, "self"));
	else
		printf("numa      %lld node%s; this process may run on several\n",
		       (long long)jint(numa, "nodes"), jint(numa, "nodes") == 1 ? "" : "s");
	if (jstr(gpu, "error") && jint(gpu, "count") > 0) {
		printf("gpu       %lld present, GPU 0 unusable: %s\n", (long long)jint(gpu, "count"),
		       jstr(gpu, "error"));
	} else if (jstr(gpu, "error") && json_object_get_boolean(jobj(gpu, "built")) &&
		   jint(gpu, "driver_version") == 0) {
		printf("gpu       none: no NVIDIA driver found (the CUDA runtime says: %s)\n",
		       jstr(gpu, "error"));
	} else if (jstr(gpu, "error")) {
		printf("gpu       none: %s\n", jstr(gpu, "error"));
	} else {
		printf("gpu       %lld: 0 is %s, compute capability %s, %lld SMs, %s (%s free), "
		       "PCI %s, NUMA node %lld\n",
		       (long long)jint(gpu, "count"), jstr(gpu, "name"),
		       jstr(gpu, "compute_capability"), (long long)jint(gpu, "sms"),
		       bytes_or_unknown(jint(gpu, "total_bytes"), a, sizeof(a)),
		       bytes_or_unknown(jint(gpu, "free_bytes"), b, sizeof(b)), jstr(gpu, "pci"),
		       (long long)jint(gpu, "numa_node"));
	}
	if (jint(gpu, "runtime_version") > 0) {
		int64_t rv = jint(gpu, "runtime_version"), dv = jint(gpu, "driver_version");

		printf("          CUDA runtime %lld.%lld, driver ", (long long)(rv / 1000),
		       (long long)(rv % 1000 / 10));
		if (dv > 0)
			printf("for CUDA %lld.%lld", (long long)(dv / 1000), (long long)(dv % 1000 / 10));
		else
			printf("none");
		if (jstr(gpu, "cublaslt"))
			printf("; %s loads\n", jstr(gpu, "cublaslt"));
		else
			printf("; cuBLASLt: %s\n", jstr(gpu, "cublaslt_error"));
	}
	printf("io_uring  %s (kernel %s)\n",
	       json_object_get_boolean(jobj(ur, "ok")) ? "works" : jstr(ur, "error"),
	       jstr(ur, "kernel") ? jstr(ur, "kernel") : "unknown");
	printf("comm      %s\n", jstr(m, "comm"));
}

static void print_dir(struct json_object *d)
{
	char a[32];

	printf("nvme      %s: %s, %s free: ", jstr(d, "dir"), jstr(d, "fs"),
	       bytes_or_unknown(jint(d, "free_bytes"), a, sizeof(a)));
	if (json_object_get_boolean(jobj(d, "ok")))
		printf("1 MiB written and read back (%s)\n", jstr(d, "tier"));
	else
		printf("FAILED: %s\n", jstr(d, "error"));
}

/* --- a checkpoint ----------------------------------------------------------- */

static char *path_join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *p = malloc(n);

	if (!p)
		st_cli_die(1, "out of memory");
	snprintf(p, n, "%s/%s", a, b);
	return p;
}

/* A run saving into the --save directory may prune (or replace) a
 * checkpoint while it is read here: that is no damage. "pruned" or
 * "replaced" for a stamped directory that is no longer there as it was,
 * else NULL (then the failure is the checkpoint's own). */
static const char *gone_since(const char *dir, const struct st_ckpt_stamp *st)
{
	switch (st_ckpt_fate(dir, st)) {
	case ST_CKPT_PRUNED: return "pruned";
	case ST_CKPT_REPLACED: return "replaced";
	case ST_CKPT_THERE: break;
	}
	return NULL;
}

/* The files a set of weights is in (strata/ckpt.h): the index, each file
 * with its size and tensor count, the dtypes, tensors, parameters. */
static struct json_object *set_json(const struct st_ckpt_set *set)
{
	struct json_object *o = json_object_new_object(), *files = json_object_new_array();
	uint64_t per[ST_SF_DTYPE_COUNT] = { 0 }, params = 0;
	char dtypes[256] = "";

	if (st_ckpt_set_index_name(set)[0])
		put_str(o, "index", st_ckpt_set_index_name(set));
	for (size_t i = 0; i < st_ckpt_set_files(set); i++) {
		const struct st_safetensors *sf = st_ckpt_reader_file(st_ckpt_set_reader(set, i));
		struct json_object *f = json_object_new_object();

		for (size_t k = 0; k < st_safetensors_count(sf); k++) {
			const struct st_sf_info *t = st_safetensors_at(sf, k);

			per[t->dtype]++;
			params += t->elems;
		}
		put_str(f, "name", st_ckpt_set_file_name(set, i));
		put_int(f, "bytes", (int64_t)st_ckpt_set_file_bytes(set, i));
		put_int(f, "tensors", (int64_t)st_safetensors_count(sf));
		json_object_array_add(files, f);
	}
	for (int d = 0; d < ST_SF_DTYPE_COUNT; d++)
		if (per[d]) {
			size_t n = strlen(dtypes);

			snprintf(dtypes + n, sizeof(dtypes) - n, "%s%s %llu", n ? ", " : "",
				 st_sf_dtype_name((enum st_sf_dtype)d), (unsigned long long)per[d]);
		}
	put_str(o, "dtypes", dtypes);
	put_int(o, "tensors", (int64_t)st_ckpt_set_count(set));
	put_int(o, "params", (int64_t)params);
	put_int(o, "data_bytes", (int64_t)st_ckpt_set_data_bytes(set));
	json_object_object_add(o, "files", files);
	return o;
}

/* config.json's first architecture (or model_type), for the line
 * "architecture: LlamaForCausalLM"; NULL when it has neither. */
static void put_architecture(struct json_object *o, const char *config)
{
	struct json_object *root = json_object_from_file(config), *v;

	if (!root)
		return;
	if (json_object_object_get_ex(root, "architectures", &v) &&
	    json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0 &&
	    json_object_is_type(json_object_array_get_idx(v, 0), json_type_string))
		put_str(o, "architecture", json_object_get_string(json_object_array_get_idx(v, 0)));
	else if (json_object_object_get_ex(root, "model_type", &v) &&
		 json_object_is_type(v, json_type_string))
		put_str(o, "architecture", json_object_get_string(v));
	json_object_put(root);
}

/* The tokenizer beside a checkpoint or weights (as generate finds it: in
 * dir, in dir/.., beside a file): "tokenizer": {path, kind, vocab}, or
 * {path, error} when it does not open. */
static void put_tokenizer(struct json_object *o, const char *at)
{
	struct json_object *t;
	struct st_tokenizer *tok;
	char dir[4096], *p;

	if (!st_cli_tokenizer_dir(at, dir, sizeof(dir)) ||
	    asprintf(&p, "%s/tokenizer.json", dir) < 0)
		return;
	t = json_object_new_object();
	put_str(t, "path", p);
	if (st_tokenizer_open(p, &tok) == 0) {
		put_str(t, "kind", st_tokenizer_kind(tok));
		put_int(t, "vocab", st_tokenizer_vocab(tok));
		st_tokenizer_close(tok);
	} else {
		put_str(t, "error", st_cli_unprefix(st_error_last(), p));
	}
	json_object_object_add(o, "tokenizer", t);
	free(p);
}

static void print_tokenizer(struct json_object *o)
{
	struct json_object *t = jobj(o, "tokenizer");

	if (!t)
		return;
	if (jstr(t, "error"))
		printf("  tokenizer: %s: %s\n", jstr(t, "path"), jstr(t, "error"));
	else
		printf("  tokenizer: %s (%s, %lld ids)\n", jstr(t, "path"), jstr(t, "kind"),
		       (long long)jint(t, "vocab"));
}

/* "  weights: N parameters in T tensors (F32 27, BF16 1), in S shards (index)";
 * what: "weights" or "files" */
static void print_set(struct json_object *wt, const char *what, const char *tail)
{
	struct json_object *files = jobj(wt, "files");
	size_t n = files ? json_object_array_length(files) : 0;

	printf("  %s: %lld %s in %lld tensors (%s)", what, (long long)jint(wt, "params"),
	       strcmp(what, "weights") == 0 ? "parameters" : "values",
	       (long long)jint(wt, "tensors"), jstr(wt, "dtypes"));
	if (jstr(wt, "index"))
		printf(", in %zu shards (%s)", n, jstr(wt, "index"));
	printf("%s\n", tail);
}

static void print_set_files(struct json_object *wt)
{
	struct json_object *files = jobj(wt, "files");
	char a[32];

	for (size_t i = 0; files && i < json_object_array_length(files); i++) {
		struct json_object *f = json_object_array_get_idx(files, i);

		printf("  %-34s %10s  %lld tensors\n", jstr(f, "name"),
		       bytes_or_unknown(jint(f, "bytes"), a, sizeof(a)), (long long)jint(f, "tensors"));
	}
}

/* One checkpoint directory: its trainer.json in brief, config.json and the
 * weights file's header read (as a resume would), and --verify. One that
 * was pruned or replaced while it was read gets "pruned" or "replaced"
 * instead of an error, and does not count as bad. */
static struct json_object *ckpt_entry(const char *name, const char *dir, bool verify,
				       bool *bad)
{
	struct json_object *o = json_object_new_object();
	struct st_ckpt_trainer tr;
	struct st_model_config gc;
	struct st_ckpt_set *set;
	struct st_ckpt_stamp st;
	char *p = path_join(dir, ST_CKPT_TRAINER_FILE);
	uint64_t bytes = 0;
	const char *gone;
	int ret;

	put_str(o, "name", name);
	/* Listed, then pruned before its reading began. */
	if (st_ckpt_stamp(dir, &st) == -ENOENT) {
		free(p);
		put_bool(o, "pruned", true);
		return o;
	}
	ret = st_ckpt_trainer_read(p, &tr);
	free(p);
	if (ret == 0) {
		put_int(o, "step", (int64_t)tr.step);
		for (size_t i = 0; i < tr.n_files; i++)
			bytes += tr.files[i].bytes;
		put_int(o, "bytes", (int64_t)bytes);
		if (verify)
			ret = st_ckpt_verify(dir, &tr);
		st_ckpt_trainer_fini(&tr);
	}
	if (ret == 0) {
		p = path_join(dir, ST_CKPT_CONFIG_FILE);
		ret = st_model_config_read(p, &gc);
		free(p);
	}
	if (ret == 0) {
		ret = st_ckpt_set_open(&set, dir, ST_CKPT_MODEL_STEM);
		if (ret == 0)
			st_ckpt_set_close(set);
	}
	if (ret < 0 && (gone = gone_since(dir, &st))) {
		put_bool(o, gone, true);
	} else if (ret < 0) {
		put_bool(o, "ok", false);
		put_str(o, "error", st_error_last());
		*bad = true;
	} else if (verify) {
		put_bool(o, "ok", true);
	}
	return o;
}

/* The shape's fields of mc's config.json (the family's names) into model. */
static void put_config(struct json_object *model, const struct st_model_config *mc)
{
	struct st_config_field f[ST_MODEL_CONFIG_FIELDS_MAX];
	int n = st_model_config_fields(mc, f);

	for (int i = 0; i < n; i++)
		put_int(model, f[i].key, f[i].value);
}

/* Details of the checkpoint in dir: step, seed, model, config, files; its
 * model into *mc (mc->n_layer 0 when unknown). */
static void ckpt_details(struct json_object *o, const char *dir, bool *bad,
			 struct st_model_config *mc)
{
	struct st_ckpt_trainer tr;
	struct st_model_config gc;
	struct st_ckpt_set *set;
	struct json_object *files, *model;
	char *p = path_join(dir, ST_CKPT_TRAINER_FILE);
	char hex[17];
	int ret = st_ckpt_trainer_read(p, &tr);

	free(p);
	if (ret < 0) {
		put_str(o, "error", st_error_last());
		*bad = true;
		return;
	}
	put_int(o, "step", (int64_t)tr.step);
	json_object_object_add(o, "seed", json_object_new_uint64(tr.seed));
	json_object_object_add(o, "config", json_tokener_parse(tr.config_json ? tr.config_json : "{}"));
	files = json_object_new_array();
	for (size_t i = 0; i < tr.n_files; i++) {
		struct json_object *f = json_object_new_object();

		put_str(f, "name", tr.files[i].name);
		put_int(f, "bytes", (int64_t)tr.files[i].bytes);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)tr.files[i].xxh64);
		put_str(f, "xxh64", hex);
		json_object_array_add(files, f);
	}
	json_object_object_add(o, "files", files);
	st_ckpt_trainer_fini(&tr);

	model = json_object_new_object();
	p = path_join(dir, ST_CKPT_CONFIG_FILE);
	ret = st_model_config_read(p, &gc);
	free(p);
	if (ret == 0) {
		put_config(model, &gc);
		*mc = gc;
	} else {
		put_str(model, "error", st_error_last());
		*bad = true;
	}
	p = path_join(dir, ST_CKPT_CONFIG_FILE);
	put_architecture(o, p);
	free(p);
	put_tokenizer(o, dir);
	/* the parameters as the weights files' headers count them */
	ret = st_ckpt_set_open(&set, dir, ST_CKPT_MODEL_STEM);
	if (ret == 0) {
		struct json_object *wt = set_json(set);

		put_int(model, "tensors", jint(wt, "tensors"));
		put_int(model, "params", jint(wt, "params"));
		json_object_object_add(o, "weights", wt);
		st_ckpt_set_close(set);
	} else {
		put_str(model, "weights_error", st_error_last());
		*bad = true;
	}
	json_object_object_add(o, "model", model);
}

/* Weights that are not a strata checkpoint (strata/weights.h: a Hugging
 * Face directory or file, an llm.c model file): what they are, the model,
 * every tensor of it there; --verify reads them all, and stops at the
 * first value that is not finite (st_weights_read() checks them). */
static struct json_object *weights_json(const char *path, bool verify, bool *bad,
					struct st_model_config *mc)
{
	struct json_object *o = json_object_new_object(), *model = json_object_new_object();
	struct st_model_config gc;
	struct st_model *m = NULL;
	struct st_weights *w;
	int ret = st_weights_open(path, &w);

	if (ret < 0)
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", path, st_error_last());
	put_str(o, "path", path);
	put_str(o, "format", st_weights_format(w));
	put_tokenizer(o, path);
	if (st_weights_set(w)) {
		const char *sp = st_ckpt_set_path(st_weights_set(w));
		const char *slash = strrchr(sp, '/');
		char *cfg;

		json_object_object_add(o, "weights", set_json(st_weights_set(w)));
		if (asprintf(&cfg, "%.*s%s", slash ? (int)(slash - sp + 1) : 0, sp,
			     ST_CKPT_CONFIG_FILE) > 0) {
			put_architecture(o, cfg);
			free(cfg);
		}
	}
	ret = st_weights_config(w, &gc);
	if (ret == -ENOENT) { /* a bare model.safetensors: no model to check it against */
		put_str(model, "unknown", st_error_last());
		json_object_object_add(o, "model", model);
		st_weights_close(w);
		return o;
	}
	if (ret == 0) {
		put_config(model, &gc);
		*mc = gc;
		ret = st_model_create(&gc, &m);
	}
	if (ret == 0)
		put_int(model, "params", (int64_t)st_model_param_count(m));
	for (int u = 0; ret == 0 && u < st_model_unit_count(m); u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);

		for (int i = 0; ret == 0 && i < ul->n_tensors; i++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];
			uint64_t shape[2] = { (uint64_t)tl->shape[0], (uint64_t)tl->shape[1] };
			float *x;

			ret = st_weights_check(w, tl->name, tl->ndim, shape);
			if (ret < 0 || !verify)
				continue;
			x = malloc(tl->n_elems * sizeof(float));
			if (!x)
				st_cli_die(1, "out of memory");
			/* names the first value that is not finite, as --init would */
			ret = st_weights_read(w, tl->name, tl->ndim, shape, x);
			free(x);
		}
	}
	if (ret < 0) {
		put_str(model, "error", st_error_last());
		*bad = true;
	} else if (verify) {
		put_bool(o, "ok", true);
	}
	json_object_object_add(o, "model", model);
	st_model_destroy(m);
	st_weights_close(w);
	return o;
}

/* "  model: GPT-2, 12 layers, dim 768, ..." as the family says it. */
static void print_model(const struct st_model_config *mc)
{
	char line[256];

	printf("  model: %s\n", st_model_config_describe(mc, line, sizeof(line)));
}

static void print_weights(struct json_object *o, bool verify, const struct st_model_config *mc)
{
	struct json_object *model = jobj(o, "model");

	printf("weights %s (%s)\n", jstr(o, "path"), jstr(o, "format"));
	if (jstr(o, "architecture"))
		printf("  architecture: %s\n", jstr(o, "architecture"));
	if (mc->n_layer > 0)
		print_model(mc);
	print_tokenizer(o);
	if (jstr(model, "unknown"))
		printf("  model: unknown (%s)\n", jstr(model, "unknown"));
	else if (jstr(model, "error"))
		printf("  DAMAGED: %s\n", jstr(model, "error"));
	else if (verify)
		printf("  weights: %lld parameters; verified: every tensor read, every value "
		       "finite\n", (long long)jint(model, "params"));
	else
		printf("  weights: %lld parameters, every tensor there with its shape\n",
		       (long long)jint(model, "params"));
	if (jobj(o, "weights")) {
		print_set(jobj(o, "weights"), "files", "");
		print_set_files(jobj(o, "weights"));
	}
}

/* How many times a --save directory is read again when the checkpoint
 * --resume takes was pruned while it was read (a run saving into it with a
 * small --keep moves on meanwhile). */
#define CKPT_READ_TRIES 20

/* One reading of a --save directory: latest, every step-N in it, and the
 * details of the one --resume takes (chosen, stamped as st before the
 * reading began). NULL when chosen was pruned or replaced meanwhile: its
 * verification would not be that of what --resume takes now. */
static struct json_object *ckpt_save_dir(const char *dir, const char *chosen,
					 const struct st_ckpt_stamp *st, bool verify, bool *bad,
					 struct st_model_config *mc)
{
	struct json_object *o = json_object_new_object(), *list = json_object_new_array();
	struct st_ckpt_step *steps = NULL;
	char *link = path_join(dir, ST_CKPT_LATEST), target[4096];
	size_t n = 0;
	ssize_t len = readlink(link, target, sizeof(target) - 1);
	int ret;

	free(link);
	target[len > 0 ? len : 0] = '\0';
	put_str(o, "dir", dir);
	put_str(o, "resume", chosen);
	put_str(o, "latest", len > 0 ? target : NULL);
	if (len > 0) {
		char *t = target[0] == '/' ? strdup(target) : path_join(dir, target);

		put_bool(o, "latest_missing", !t || access(t, F_OK) < 0);
		free(t);
	}
	ret = st_ckpt_list(dir, &steps, &n);
	if (ret < 0)
		st_cli_die(1, "--ckpt %s", st_error_last());
	for (size_t i = 0; i < n; i++) {
		char *sd = path_join(dir, steps[i].name);

		json_object_array_add(list, ckpt_entry(steps[i].name, sd, verify, bad));
		free(sd);
	}
	st_ckpt_list_free(steps, n);
	json_object_object_add(o, "checkpoints", list);
	ckpt_details(o, chosen, bad, mc);
	if (st_ckpt_fate(chosen, st) != ST_CKPT_THERE) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

static struct json_object *ckpt_json(const char *dir, bool verify, bool *bad,
				      struct st_model_config *mc)
{
	struct json_object *o = NULL;
	char *chosen, *tj = path_join(dir, ST_CKPT_TRAINER_FILE);
	bool single = access(tj, F_OK) == 0;
	int ret;

	free(tj);
	if (access(dir, F_OK) < 0)
		st_cli_die(2, "--ckpt %s: %s", dir, strerror(errno));
	for (int tries = 0; !o && tries < CKPT_READ_TRIES; tries++) {
		struct st_ckpt_stamp st;
		bool pass_bad = false;

		ret = st_ckpt_resolve(dir, &chosen);
		if ((ret == -ENOENT || ret == -ENOTDIR) && tries == 0) {
			/* not a checkpoint: other weights? */
			return weights_json(dir, verify, bad, mc);
		}
		if (ret < 0)
			st_cli_die(1, "--ckpt %s", st_error_last());
		if (single) {
			o = json_object_new_object();
			put_str(o, "dir", dir);
			put_str(o, "resume", chosen);
			json_object_object_add(o, "checkpoints", json_object_new_array());
			json_object_array_add(jobj(o, "checkpoints"),
					      ckpt_entry(dir, dir, verify, bad));
			ckpt_details(o, chosen, bad, mc);
		} else if (st_ckpt_stamp(chosen, &st) == 0) {
			/* latest moved on and its old target was pruned
			 * before the stamp: resolve again */
			o = ckpt_save_dir(dir, chosen, &st, verify, &pass_bad, mc);
			if (o)
				*bad = *bad || pass_bad;
		}
		free(chosen);
	}
	if (!o)
		st_cli_die(1, "--ckpt %s: the checkpoint --resume takes was pruned while it was "
			   "read, %d times (a run is saving into it with a small --keep)", dir,
			   CKPT_READ_TRIES);
	return o;
}

/* The training config as "key value" pairs, wrapped. */
static void print_config(struct json_object *cfg)
{
	int col = 0;

	if (!cfg || !json_object_is_type(cfg, json_type_object))
		return;
	json_object_object_foreach(cfg, key, val) {
		char item[512];
		int n;

		if (json_object_is_type(val, json_type_double))
			n = snprintf(item, sizeof(item), "%s %g", key, json_object_get_double(val));
		else
			n = snprintf(item, sizeof(item), "%s %s", key, json_object_get_string(val));
		if (col == 0 || col + 2 + n > 78) {
			printf("%s  %s %s", col ? "\n" : "", col ? "        " : "trained:", item);
			col = 2 + 9 + n;
		} else {
			printf(", %s", item);
			col += 2 + n;
		}
	}
	if (col)
		printf("\n");
}

static void print_ckpt(struct json_object *o, bool verify, const struct st_model_config *mc)
{
	struct json_object *model = jobj(o, "model"), *list = jobj(o, "checkpoints"),
			   *files = jobj(o, "files");
	char a[32];

	printf("checkpoint %s (what --resume %s takes)\n", jstr(o, "resume"), jstr(o, "dir"));
	if (jstr(o, "error")) {
		printf("  DAMAGED: %s\n", jstr(o, "error"));
	} else {
		printf("  step %lld, seed %s\n", (long long)jint(o, "step"), jstr(o, "seed"));
		if (jstr(o, "architecture"))
			printf("  architecture: %s\n", jstr(o, "architecture"));
		if (jstr(model, "error"))
			printf("  model: %s\n", jstr(model, "error"));
		else
			print_model(mc);
		print_tokenizer(o);
		if (jstr(model, "weights_error"))
			printf("  weights: %s\n", jstr(model, "weights_error"));
		else
			print_set(jobj(o, "weights"), "weights", "");
		print_config(jobj(o, "config"));
		for (size_t i = 0; files && i < json_object_array_length(files); i++) {
			struct json_object *f = json_object_array_get_idx(files, i);

			printf("  %-*s %10s  xxh64 %s\n", (int)ST_MAX(24, strlen(jstr(f, "name"))),
			       jstr(f, "name"),
			       bytes_or_unknown(jint(f, "bytes"), a, sizeof(a)), jstr(f, "xxh64"));
		}
	}
	if (strcmp(jstr(o, "resume"), jstr(o, "dir")) != 0) {
		printf("checkpoints in %s", jstr(o, "dir"));
		if (jstr(o, "latest"))
			printf(" (latest -> %s%s)", jstr(o, "latest"),
			       json_object_get_boolean(jobj(o, "latest_missing")) ? ", which is missing"
										: "");
		printf(":\n");
	} else {
		struct json_object *e = json_object_array_get_idx(list, 0);

		if (verify && !jstr(e, "error"))
			printf("  verified: every file's size and XXH64 match\n");
		else if (verify && !jstr(o, "error"))
			printf("  verify FAILED: %s\n", jstr(e, "error"));
		return;
	}
	for (size_t i = 0; i < json_object_array_length(list); i++) {
		struct json_object *e = json_object_array_get_idx(list, i);

		printf("  %-14s ", jstr(e, "name"));
		if (json_object_get_boolean(jobj(e, "pruned")) ||
		    json_object_get_boolean(jobj(e, "replaced"))) {
			printf("%s while being read (a run is saving into %s)\n",
			       jobj(e, "pruned") ? "pruned" : "replaced", jstr(o, "dir"));
			continue;
		}
		if (jstr(e, "error")) {
			printf("DAMAGED: %s\n", jstr(e, "error"));
			continue;
		}
		printf("step %-8lld %10s%s\n", (long long)jint(e, "step"),
		       bytes_or_unknown(jint(e, "bytes"), a, sizeof(a)),
		       verify ? "  verified: sizes and XXH64 match" : "");
	}
}

int st_cli_info(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "nvme", 1, 0, 'n' }, { "ckpt", 1, 0, 'c' }, { "verify", 0, 0, 'v' },
		{ "json", 0, 0, 'j' }, { "help", 0, 0, 'h' }, { 0 },
	};
	const char *nvme = NULL, *ckpt = NULL;
	bool json = false, verify = false, bad = false;
	struct json_object *out;
	struct st_model_config mc = { 0 };
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'n': nvme = optarg; break;
		case 'c': ckpt = optarg; break;
		case 'v': verify = true; break;
		case 'j': json = true; break;
		case 'h': info_usage(stdout); return 0;
		default:
			st_cli_die(2, "info: unknown or incomplete option %s (see strata info --help)",
				   argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "info: unexpected argument %s", argv[optind]);
	if (ckpt && nvme)
		st_cli_die(2, "info: --ckpt and --nvme are separate uses (see strata info --help)");
	if (verify && !ckpt)
		st_cli_die(2, "info: --verify needs --ckpt DIR");
	if (nvme) /* before the machine's probes, which may take a GPU's seconds */
		st_cli_check_dirs("--nvme", nvme, true);
	if (ckpt) {
		out = ckpt_json(ckpt, verify, &bad, &mc);
	} else {
		out = machine_json();
		if (nvme) {
			struct json_object *dirs = json_object_new_array();
			char *list, *save = NULL;

			list = strdup(nvme);
			if (!list)
				st_cli_die(1, "out of memory");
			for (char *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
				struct json_object *r = probe_dir(d);

				if (!json_object_get_boolean(jobj(r, "ok"))) {
					/* the exit status's reason, where errors go too */
					fprintf(stderr, "strata: info: --nvme %s: %s\n", d,
						jstr(r, "error"));
					bad = true;
				}
				json_object_array_add(dirs, r);
			}
			free(list);
			json_object_object_add(out, "nvme", dirs);
		}
	}
	if (json) {
		puts(json_object_to_json_string_ext(out, JSON_C_TO_STRING_PRETTY |
							   JSON_C_TO_STRING_NOSLASHESCAPE));
	} else if (ckpt && jstr(out, "format")) {
		print_weights(out, verify, &mc);
	} else if (ckpt) {
		print_ckpt(out, verify, &mc);
	} else {
		struct json_object *dirs = jobj(out, "nvme");

		print_machine(out);
		for (size_t i = 0; dirs && i < json_object_array_length(dirs); i++)
			print_dir(json_object_array_get_idx(dirs, i));
	}
	json_object_put(out);
	return bad ? 1 : 0; /* main() checks that stdout was written */
}
