/* --device auto: the cuda device when its probe finds a usable GPU (this
 * rank's, under a launcher), else cpu; the choice and its reason are said
 * (strata plan, strata train). The rule itself is st_device_choose()
 * (strata/device.h), held to fake probes in tests/device. */
#include "cli.h"
#include "strata/comm.h"
#include "strata/device.h"
#ifdef ST_HAVE_CUDA
#include "strata/cuda.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#ifdef ST_HAVE_CUDA
/* The cuda device's probe: GPU ordinal is there and answers (a context
 * made on it: its free memory is what the arena may take). */
static void cuda_probe(int ordinal, struct st_device_probe *out)
{
	struct st_cuda_info ci;
	int ret = st_cuda_info(ordinal, &ci);

	if (ret == -ENODEV && ci.count > 0 && ordinal >= ci.count) /* more ranks than GPUs */
		ret = st_cuda_info(ordinal % ci.count, &ci);
	out->usable = ret == 0;
	if (ret < 0) {
		const char *msg = st_error_last();

		/* the runtime's reason, without the "cuda: no usable GPU: " the
		 * choice says already */
		if (strncmp(msg, "cuda: no usable GPU: ", 21) == 0)
			msg += 21;
		snprintf(out->what, sizeof(out->what), "%s", msg);
		return;
	}
	out->free_bytes = ci.free_bytes;
	out->total_bytes = ci.total_bytes;
	snprintf(out->what, sizeof(out->what), "%s", ci.name);
}
#endif

const char *st_cli_device_default(void)
{
	const char *env = getenv("ST_DEVICE");

	if (!env || !*env)
		return "auto";
	if (strcmp(env, "auto") != 0 && !st_device_find(env))
		st_cli_die(2, "ST_DEVICE=%s: expected auto or a device built into this binary (%s)",
			   env, st_device_list());
	return env;
}

const char *st_cli_device(const char *asked, struct st_device_probe *p, char *why, size_t n)
{
	struct st_comm_launch l;
	int ordinal;

	memset(p, 0, sizeof(*p));
	why[0] = '\0';
	if (strcmp(asked, "auto") != 0 && strcmp(asked, "cuda") != 0)
		return asked;
	st_comm_launch(&l);
	ordinal = l.launcher && l.local_rank > 0 ? l.local_rank : 0;
#ifdef ST_HAVE_CUDA
	if (strcmp(asked, "cuda") == 0) { /* as asked: the probe for --gpu-mem auto */
		cuda_probe(ordinal, p);
		return asked;
	}
	return st_device_choose(true, cuda_probe, ordinal, p, why, n);
#else
	return strcmp(asked, "cuda") == 0 ? asked : st_device_choose(false, NULL, ordinal, p, why, n);
#endif
}

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return (uint64_t)kb * 1024;
}

/* The processes of this job on this node (a launcher's ranks share the
 * machine's memory): world / nodes rounded up, or 1. */
static int ranks_here(void)
{
	struct st_comm_launch l;

	st_comm_launch(&l);
	if (!l.launcher || l.world <= 1)
		return 1;
	return l.nodes > 0 ? (l.world + l.nodes - 1) / l.nodes : l.world;
}

uint64_t st_cli_gpu_mem_auto(const char *device, const struct st_device_probe *p, char *why,
			     size_t n)
{
	char a[32], b[32];
	uint64_t avail, margin, v;

	if (strcmp(device, "cuda") == 0) {
		if (!p->usable)
			st_cli_die(2, "--gpu-mem auto: no usable GPU (%s)", p->what);
		margin = ST_MAX(ST_CLI_GPU_MARGIN_MIN, p->total_bytes / 20);
		if (p->free_bytes < margin + 64 * ST_MiB)
			st_cli_die(2, "--gpu-mem auto: the GPU has %s free, not more than the margin "
				   "of %s: give --gpu-mem SIZE",
				   st_format_bytes(p->free_bytes, a, sizeof(a)),
				   st_format_bytes(margin, b, sizeof(b)));
		v = (p->free_bytes - margin) / ST_MiB * ST_MiB;
		snprintf(why, n, "the GPU's %s free less a margin of %s",
			 st_format_bytes(p->free_bytes, a, sizeof(a)),
			 st_format_bytes(margin, b, sizeof(b)));
		return v;
	}
	avail = mem_available();
	if (!avail)
		st_cli_die(2, "--gpu-mem auto: MemAvailable is not in /proc/meminfo: give --gpu-mem SIZE");
	/* the cpu devices' arena is host memory: a quarter of what is free */
	v = avail / 4 / (uint64_t)ranks_here() / ST_MiB * ST_MiB;
	snprintf(why, n, "a quarter of MemAvailable %s%s: the %s device's arena is host memory",
		 st_format_bytes(avail, a, sizeof(a)), ranks_here() > 1 ? ", shared by the ranks" : "",
		 device);
	return v;
}

uint64_t st_cli_host_mem_auto(const char *device, char *why, size_t n)
{
	char a[32], b[32];
	bool cuda = strcmp(device, "cuda") == 0;
	uint64_t avail = mem_available(), v;
	struct rlimit rl;
	int len;

	if (!avail)
		st_cli_die(2, "--host-mem auto: MemAvailable is not in /proc/meminfo: give --host-mem SIZE");
	/* the cuda device pins through cudaHostRegister; the cpu devices' own
	 * arena takes another quarter */
	v = avail / (cuda ? 2 : 4) / (uint64_t)ranks_here() / 4096 * 4096;
	len = snprintf(why, n, "%s of MemAvailable %s%s", cuda ? "half" : "a quarter",
		       st_format_bytes(avail, a, sizeof(a)),
		       ranks_here() > 1 ? ", shared by the ranks" : "");
	/* elsewhere the host tier mlocks its region, up to RLIMIT_MEMLOCK's
	 * hard limit (tiers/host.c) */
	if (!cuda && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_max != RLIM_INFINITY &&
	    v > rl.rlim_max / 4096 * 4096) {
		v = rl.rlim_max / 4096 * 4096;
		if (len > 0 && (size_t)len < n)
			snprintf(why + len, n - (size_t)len, ", within RLIMIT_MEMLOCK's hard limit "
				 "of %s: the host tier locks it, ulimit -l raises it",
				 st_format_bytes(rl.rlim_max, b, sizeof(b)));
	}
	if (v == 0)
		st_cli_die(2, "--host-mem auto: nothing to take (%s): give --host-mem SIZE", why);
	return v;
}

void st_cli_print_auto_budgets(uint64_t gpu, const char *gpu_why, uint64_t host,
			       const char *host_why)
{
	char b[32];

	if (gpu_why)
		printf("--gpu-mem auto: %s (%s)\n", st_format_bytes(gpu, b, sizeof(b)), gpu_why);
	if (host_why)
		printf("--host-mem auto: %s (%s)\n", st_format_bytes(host, b, sizeof(b)), host_why);
}

void st_cli_budget_arg(struct st_cli_budgets *b, bool gpu, const char *arg, uint64_t *bytes)
{
	bool is_auto = strcmp(arg, "auto") == 0;

	*(gpu ? &b->gpu_given : &b->host_given) = true;
	*(gpu ? &b->gpu_auto : &b->host_auto) = is_auto;
	if (!is_auto)
		*bytes = st_cli_size(gpu ? "--gpu-mem" : "--host-mem", arg);
}

void st_cli_budgets_resolve(struct st_cli_budgets *b, const char **device, uint64_t *gpu_bytes,
			    uint64_t *host_bytes)
{
	if (strcmp(*device, "auto") == 0)
		*device = st_cli_device("auto", &b->probe, b->device_why, sizeof(b->device_why));
	/* on a GPU the budgets not given are what the machine has */
	if (strcmp(*device, "cuda") == 0 || b->auto_default) {
		b->gpu_auto |= !b->gpu_given;
		b->host_auto |= !b->host_given;
	}
	if (b->gpu_auto && strcmp(*device, "cuda") == 0)
		st_cli_device("cuda", &b->probe, b->device_why, sizeof(b->device_why));
	if (b->gpu_auto)
		*gpu_bytes = st_cli_gpu_mem_auto(*device, &b->probe, b->gpu_why, sizeof(b->gpu_why));
	if (b->host_auto)
		*host_bytes = st_cli_host_mem_auto(*device, b->host_why, sizeof(b->host_why));
}

void st_cli_budgets_print(const struct st_cli_budgets *b, const char *device, uint64_t gpu_bytes,
			  uint64_t host_bytes)
{
	if (b->device_why[0])
		printf("device: %s (--device auto: %s)\n", device, b->device_why);
	st_cli_print_auto_budgets(gpu_bytes, b->gpu_auto ? b->gpu_why : NULL, host_bytes,
				  b->host_auto ? b->host_why : NULL);
}
