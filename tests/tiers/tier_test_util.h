/* Shared by the tier tests: scratch directories and a seeded PRNG. */
#ifndef TIER_TEST_UTIL_H
#define TIER_TEST_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static inline uint64_t tt_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void tt_fill(void *buf, size_t n, uint64_t seed)
{
	uint8_t *b = buf;

	for (size_t i = 0; i < n; i++) {
		if (i % 8 == 0)
			seed = tt_rand(&seed);
		b[i] = (uint8_t)(seed >> (8 * (i % 8)));
	}
}

/* A fresh empty directory under $ST_TEST_DIR (meson sets it to the build
 * directory, a real disk) or /var/tmp. */
static inline char *tt_mkdtemp(void)
{
	const char *base = getenv("ST_TEST_DIR");
	char *p = malloc(4096);

	snprintf(p, 4096, "%s/strata-test.XXXXXX", base && *base ? base : "/var/tmp");
	if (!mkdtemp(p)) {
		perror("mkdtemp");
		exit(99);
	}
	return p;
}

static inline int tt_count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static inline void tt_rmdir(char *dir)
{
	rmdir(dir);
	free(dir);
}

#endif
