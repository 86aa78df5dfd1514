/*
 * LD_PRELOAD shim for tools/measure_cgroup_v2.py, a measurement only (issue 44).
 *
 * Slurm's cgroup/v2 plugin stops with "Hybrid mode is not supported" when the first line of
 * /proc/<pid>/cgroup is not the cgroup2 one (cgroup_v2.c, _get_proc_cg_path()); on a machine
 * with cgroup v1 hierarchies mounted it always is not. A read-only open of /proc/<pid>/cgroup
 * here returns a memfd holding only the "0::" line; every other open goes through unchanged.
 * Never for a site: it hides the truth from Slurm to see what it would do on a v2-only host.
 *
 *   gcc -shared -fPIC -O2 -Wall -o cgroup_v1hide.so tools/cgroup_v1hide.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*open_fn)(const char *, int, ...);

/* "/proc/<anything without a slash>/cgroup" */
static int is_proc_cgroup(const char *path)
{
	const char *rest;
	size_t len;

	if (!path || strncmp(path, "/proc/", 6))
		return 0;
	rest = path + 6;
	len = strlen(rest);
	return len > 7 && !strcmp(rest + len - 7, "/cgroup") && !memchr(rest, '/', len - 7);
}

static int open_filtered(const char *path, open_fn real)
{
	char buf[65536], out[65536];
	ssize_t got, total = 0;
	size_t used = 0;
	char *line, *save = NULL;
	int fd = real(path, O_RDONLY | O_CLOEXEC), mfd;

	if (fd < 0)
		return fd;
	while ((got = read(fd, buf + total, sizeof(buf) - 1 - total)) > 0)
		total += got;
	close(fd);
	buf[total] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		if (!strncmp(line, "0::", 3) && used < sizeof(out))
			used += snprintf(out + used, sizeof(out) - used, "%s\n", line);
	if (used > sizeof(out))
		used = sizeof(out);
	mfd = memfd_create("cgroup", MFD_CLOEXEC);
	if (mfd < 0)
		return -1;
	if (write(mfd, out, used) != (ssize_t)used || lseek(mfd, 0, SEEK_SET) != 0) {
		close(mfd);
		return -1;
	}
	return mfd;
}

#define WRAP(name)                                                                   \
	int name(const char *path, int flags, ...)                                   \
	{                                                                            \
		static open_fn real;                                                 \
		mode_t mode = 0;                                                     \
		va_list ap;                                                          \
		if (!real)                                                           \
			real = (open_fn)dlsym(RTLD_NEXT, #name);                     \
		va_start(ap, flags);                                                 \
		if (flags & (O_CREAT | O_TMPFILE))                                   \
			mode = va_arg(ap, mode_t);                                   \
		va_end(ap);                                                          \
		if (is_proc_cgroup(path) && !(flags & (O_WRONLY | O_RDWR)))          \
			return open_filtered(path, real);                            \
		return real(path, flags, mode);                                      \
	}
WRAP(open)
WRAP(open64)

/* What _FORTIFY_SOURCE builds call for a two-argument open(). */
int __open_2(const char *path, int flags)
{
	return open(path, flags);
}

int __open64_2(const char *path, int flags)
{
	return open64(path, flags);
}
