/* hwloc helpers shared by the devices and the host tier: which NUMA node is
 * nearest a PCI device, which node the calling thread runs on, and how
 * many there are (strata info). */
#include "strata/common.h"
#include "strata/device.h"

#include <hwloc.h>
#include <stdio.h>

static int numa_of_cpuset(hwloc_topology_t topo, hwloc_const_cpuset_t set)
{
	hwloc_obj_t obj = NULL;
	int node = -1;

	obj = hwloc_get_next_obj_covering_cpuset_by_type(topo, set,
							 HWLOC_OBJ_NUMANODE, NULL);
	if (obj)
		node = (int)obj->os_index;
	return node;
}

/* NUMA node (OS index) closest to the PCI device "dddd:bb:dd.f", or -1. */
int st_hwloc_numa_of_pci(const char *busid)
{
	hwloc_topology_t topo;
	hwloc_obj_t dev, anc;
	int node = -1;

	if (hwloc_topology_init(&topo) < 0)
		return -1;
	hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (hwloc_topology_load(topo) == 0) {
		dev = hwloc_get_pcidev_by_busidstring(topo, busid);
		anc = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
		if (anc && anc->cpuset)
			node = numa_of_cpuset(topo, anc->cpuset);
	}
	hwloc_topology_destroy(topo);
	return node;
}

/* NUMA node of the CPUs this thread may run on, or -1 when they span
 * several nodes or hwloc cannot tell. */
int st_hwloc_numa_of_self(void)
{
	hwloc_topology_t topo;
	hwloc_bitmap_t set;
	int node = -1;

	if (hwloc_topology_init(&topo) < 0)
		return -1;
	set = hwloc_bitmap_alloc();
	if (set && hwloc_topology_load(topo) == 0 &&
	    hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_THREAD) == 0)
		node = numa_of_cpuset(topo, set);
	hwloc_bitmap_free(set);
	hwloc_topology_destroy(topo);
	return node;
}

int st_hwloc_numa_count(void)
{
	hwloc_topology_t topo;
	int n = 1;

	if (hwloc_topology_init(&topo) < 0)
		return 1;
	/* the machine's nodes, not only those this process's cpuset allows */
	hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
	if (hwloc_topology_load(topo) == 0)
		n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
	hwloc_topology_destroy(topo);
	return n > 0 ? n : 1;
}
