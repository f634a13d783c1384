/* Runs the fuzz target over files and directories of files given on the
 * command line (the committed corpus), for compilers without libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f) {
		perror(path);
		return -1;
	}
	do {
		if (len == cap) {
			uint8_t *p = realloc(buf, cap = cap ? 2 * cap : 4096);

			if (!p) {
				fclose(f);
				free(buf);
				return -1;
			}
			buf = p;
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	fclose(f);
	/* An exact-size copy, so ASan sees any read past the input's end. */
	{
		uint8_t *exact = malloc(len ? len : 1);

		if (!exact) {
			free(buf);
			return -1;
		}
		memcpy(exact, buf, len);
		free(buf);
		LLVMFuzzerTestOneInput(exact, len);
		free(exact);
	}
	return 0;
}

int main(int argc, char **argv)
{
	int files = 0;

	for (int i = 1; i < argc; i++) {
		struct stat sb;

		if (stat(argv[i], &sb) < 0) {
			perror(argv[i]);
			return 1;
		}
		if (S_ISDIR(sb.st_mode)) {
			DIR *d = opendir(argv[i]);
			struct dirent *e;
			char path[4096];

			if (!d) {
				perror(argv[i]);
				return 1;
			}
			while ((e = readdir(d))) {
				if (e->d_name[0] == '.')
					continue;
				snprintf(path, sizeof(path), "%s/%s", argv[i],
					 e->d_name);
				if (run_file(path))
					return 1;
				files++;
			}
			closedir(d);
		} else {
			if (run_file(argv[i]))
				return 1;
			files++;
		}
	}
	printf("replayed %d inputs\n", files);
	return files > 0 ? 0 : 1;
}
