/* strata: `strata info` on this machine (the build, the CPU and the AdamW
 * kernel it picks, memory, huge pages and the locked-memory limit, NUMA,
 * the GPU or why there is none, io_uring, the comm backends) and in the
 * --nvme directories (each probed with the nvme tier itself). */
#include "cli.h"
#include "info.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/optim.h"
#include "strata/tier.h"
#ifdef ST_HAVE_CUDA
#include "strata/cuda.h"
#endif

#include <cblas.h>
#include <errno.h>
#include <json-c/json.h>
#include <liburing.h>
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

struct json_object *st_cli_info_machine_json(void)
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
struct json_object *st_cli_info_probe_dir(const char *dir)
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

void st_cli_info_print_machine(struct json_object *m)
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

void st_cli_info_print_dir(struct json_object *d)
{
	char a[32];

	printf("nvme      %s: %s, %s free: ", jstr(d, "dir"), jstr(d, "fs"),
	       bytes_or_unknown(jint(d, "free_bytes"), a, sizeof(a)));
	if (json_object_get_boolean(jobj(d, "ok")))
		printf("1 MiB written and read back (%s)\n", jstr(d, "tier"));
	else
		printf("FAILED: %s\n", jstr(d, "error"));
}
