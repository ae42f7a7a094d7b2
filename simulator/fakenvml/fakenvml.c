/*
 * A simulated libnvidia-ml.so.1 for tests, the demo and benchmarks.
 *
 * Compiled against the real nvml.h (PyPI nvidia-nvml-dev), so struct layouts, return
 * codes and the versioned entry points (nvmlInit -> nvmlInit_v2 ...) are the driver's.
 * The unmodified nvidia-ml-py binding loads it through its normal loader.
 *
 * It knows nothing of scenarios: simulator/nvml.py renders the node at a scenario
 * time into a line-oriented state file (path in $KDE_FAKENVML_STATE), replaced atomically,
 * and this library re-reads it whenever its inode, size or mtime changes. A key missing
 * from a device block means NVML_ERROR_NOT_SUPPORTED for whatever reads it.
 *
 * State file (one record per line, "key value..."):
 *   time <scenario seconds>          timestamp_us <CPU time of the values, us since 1970>
 *   driver <version>  loaded <0|1>   generation <driver reloads so far>
 *   privileged <0|1>                 0: answer NO_PERMISSION where nvml.h says a call
 *                                    needs privileges (see exporter/sources/nvml/behaviour.py)
 *   pid_namespace <host|own>         own: the caller is in its own PID namespace (a pod
 *                                    without hostPID): the process lists show none of the
 *                                    host's processes, utilization samples keep host PIDs
 *                                    (measured on a real driver: behaviour.py, MEASURED)
 *   slow <function|*> <ms>           delay before a call, outside the lock
 *   missing <function>               the call answers NVML_ERROR_FUNCTION_NOT_FOUND (an
 *                                    older driver; pynvml raises as for a missing symbol)
 *   gpu <index>                      starts a GPU block; keys below belong to it
 *   mig <gpu index> <slot>           starts a MIG block (keys below belong to it)
 *   proc <pid> <bytes> <gi> <ci> <sm%> <mem%>   a compute process of the current GPU
 *   xid <seq> <gpu index> <xid> <gi> <ci>       an XID event (delivered once per event set)
 * Device keys: see simulator/nvml_state.py (uuid, name, pci, minor, ...); a
 * value "!<code>" makes every read of that key fail with that NVML return code.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "nvml.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 64
#define MAX_MIGS 8
#define MAX_KEYS 96
#define MAX_PROCS 64
#define MAX_XIDS 4096
#define MAX_SLOW 32
#define NO_ID 0xFFFFFFFFu

/* ---------------------------------------------------------------- state */

typedef struct {
    char key[64];
    char val[120];
} kv_t;

typedef struct {
    kv_t kv[MAX_KEYS];
    int n;
} obj_t;

typedef struct {
    unsigned pid, gi, ci, sm, mem;
    unsigned long long bytes;
} proc_t;

typedef struct {
    obj_t o;
    int present;
} mig_t;

typedef struct {
    obj_t o;
    mig_t migs[MAX_MIGS];
    proc_t procs[MAX_PROCS];
    int nprocs;
} gpu_t;

typedef struct {
    unsigned long long seq, xid;
    unsigned gpu, gi, ci;
} xid_t;

typedef struct {
    char fn[64];
    unsigned ms;
} slow_t;

typedef struct {
    double time;
    unsigned long long timestamp_us;
    char driver[80];
    int loaded;
    int privileged;
    int host_pid_namespace;
    unsigned generation;
    int ngpus;
    gpu_t gpus[MAX_GPUS];
    xid_t xids[MAX_XIDS];
    int nxids;
    slow_t slow[MAX_SLOW];
    int nslow;
    char missing[MAX_SLOW][64];
    int nmissing;
} state_t;

/* A handle is the address of one of these. GPU handles are issued per library
 * generation, so handles from before a driver reload stop working; a MIG handle names
 * one MIG device, so it stops working when the slice is destroyed or reconfigured. */
struct nvmlDevice_st {
    int gpu;
    int mig; /* -1: the full GPU */
    unsigned generation;
    char uuid[96]; /* MIG handles: the device they were issued for */
};

/* A GPU instance handle names the MIG device it was issued for: when that slot is
 * reconfigured the handle stops working, as a MIG device handle does. */
struct nvmlGpuInstance_st {
    struct nvmlDevice_st *mig;
};

typedef struct {
    struct nvmlDevice_st gpus[MAX_GPUS];
    struct nvmlDevice_st *migs[MAX_GPUS][MAX_MIGS];
    struct nvmlGpuInstance_st *instances[MAX_GPUS][MAX_MIGS];
} handles_t;

struct nvmlEventSet_st {
    unsigned long long cursor;
    unsigned long long types[MAX_GPUS];
    int watch; /* inotify on the state's directory, for the whole life of the set; -1: none */
};

/* One GPM sample: the counters of one GPU or GPU instance at one scenario time. Each is
 * cumulative (busy seconds, bytes), so nvmlGpmMetricsGet's value is the rate between two
 * samples; GPM_COUNTERS are the state keys, in the order of the array. */
enum { GPM_GR, GPM_SM, GPM_OCC, GPM_TENSOR, GPM_FP64, GPM_FP32, GPM_FP16, GPM_DRAM,
       GPM_PCIE_TX, GPM_PCIE_RX, GPM_NVLINK_TX, GPM_NVLINK_RX, GPM_N };
static const char *const GPM_COUNTERS[GPM_N] = {
    "gpm_busy_s", "gpm_sm_s", "gpm_occupancy_s", "gpm_tensor_s", "gpm_fp64_s", "gpm_fp32_s",
    "gpm_fp16_s", "gpm_dram_s", "gpm_pcie_tx_bytes", "gpm_pcie_rx_bytes",
    "gpm_nvlink_tx_bytes", "gpm_nvlink_rx_bytes",
};

struct nvmlGpmSample_st {
    int valid, gpu, gi;
    double time;
    double counter[GPM_N]; /* NAN: the device has no such counter (NOT_SUPPORTED) */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static state_t *cur;          /* NULL: no readable state file (no driver) */
static char state_path[4096];
static struct stat state_stat;
static int refcount;
static unsigned lib_generation;
/* What real NVML fixes when it initializes (behaviour.py: enumerated-at-init,
 * rm-version-mismatch): the device count until the last nvmlShutdown, and the driver
 * version of the first successful init, i.e. of the library this process mapped. */
static int init_ngpus;
static char lib_driver[80];
static handles_t *handles;

/* ---------------------------------------------------------------- call counts */

static struct {
    const char *fn;
    unsigned long long n;
} calls[128];
static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;

static void count_call(const char *fn) {
    pthread_mutex_lock(&calls_mu);
    /* `fn` is a __func__: the same pointer every call, so look for it before comparing
     * strings (the stand-in's bookkeeping must not cost the bench what a driver would not). */
    for (int i = 0; i < 128 && calls[i].fn; i++) {
        if (calls[i].fn == fn) {
            calls[i].n++;
            pthread_mutex_unlock(&calls_mu);
            return;
        }
    }
    for (int i = 0; i < 128; i++) {
        if (calls[i].fn == NULL) calls[i].fn = fn;
        if (calls[i].fn == fn || strcmp(calls[i].fn, fn) == 0) {
            calls[i].n++;
            break;
        }
    }
    pthread_mutex_unlock(&calls_mu);
}

/* Test hooks (not NVML API): how often a function was called; reset all counts. */
EXPORT unsigned long long fakenvml_call_count(const char *fn) {
    unsigned long long n = 0;
    pthread_mutex_lock(&calls_mu);
    for (int i = 0; i < 128 && calls[i].fn; i++)
        if (strcmp(calls[i].fn, fn) == 0) n = calls[i].n;
    pthread_mutex_unlock(&calls_mu);
    return n;
}

EXPORT void fakenvml_reset_counts(void) {
    pthread_mutex_lock(&calls_mu);
    for (int i = 0; i < 128; i++) calls[i].n = 0;
    pthread_mutex_unlock(&calls_mu);
}

/* ---------------------------------------------------------------- parsing */

static const char *get(const obj_t *o, const char *key) {
    for (int i = 0; i < o->n; i++)
        if (strcmp(o->kv[i].key, key) == 0) return o->kv[i].val;
    return NULL;
}

static void copy_text(char *dst, size_t size, const char *src, size_t len) {
    if (len >= size) len = size - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

static void put(obj_t *o, const char *key, const char *val) {
    if (o == NULL || o->n >= MAX_KEYS) return;
    copy_text(o->kv[o->n].key, sizeof o->kv[o->n].key, key, strlen(key));
    copy_text(o->kv[o->n].val, sizeof o->kv[o->n].val, val, strlen(val));
    o->n++;
}

/* States are big fixed-size tables, mostly empty: mapped, not calloc'ed, so the pages a
 * state does not use are never touched (calloc from a thread arena zeroes all ~10 MiB,
 * which a real driver's process would not carry). */
static state_t *new_state(void) {
    void *p = mmap(NULL, sizeof(state_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void free_state(state_t *s) {
    if (s != NULL) munmap(s, sizeof *s);
}

static state_t *parse(FILE *f) {
    state_t *s = new_state();
    char line[512];
    obj_t *obj = NULL;
    gpu_t *gpu = NULL;
    if (s == NULL) return NULL;
    s->privileged = 1;
    s->host_pid_namespace = 1;
    while (fgets(line, sizeof line, f)) {
        /* The key is the first word, the value the rest after the spaces (no sscanf: a
         * parse per state write is the stand-in's own cost, not the exporter's). */
        char key[64], *val, *start;
        size_t len;
        line[strcspn(line, "\n")] = 0;
        start = line + strspn(line, " \t");
        len = strcspn(start, " \t");
        if (len == 0 || start[0] == '#') continue;
        copy_text(key, sizeof key, start, len);
        val = start + len;
        val += strspn(val, " \t");
        if (strcmp(key, "gpu") == 0) {
            int i = atoi(val);
            if (i < 0 || i >= MAX_GPUS) continue;
            gpu = &s->gpus[i];
            obj = &gpu->o;
            if (i + 1 > s->ngpus) s->ngpus = i + 1;
        } else if (strcmp(key, "mig") == 0) {
            int g, slot;
            if (sscanf(val, "%d %d", &g, &slot) != 2 || g < 0 || g >= MAX_GPUS || slot < 0 ||
                slot >= MAX_MIGS)
                continue;
            s->gpus[g].migs[slot].present = 1;
            obj = &s->gpus[g].migs[slot].o;
        } else if (strcmp(key, "proc") == 0) {
            proc_t p;
            if (gpu && gpu->nprocs < MAX_PROCS &&
                sscanf(val, "%u %llu %u %u %u %u", &p.pid, &p.bytes, &p.gi, &p.ci, &p.sm, &p.mem) == 6)
                gpu->procs[gpu->nprocs++] = p;
        } else if (strcmp(key, "xid") == 0) {
            xid_t x;
            if (s->nxids < MAX_XIDS &&
                sscanf(val, "%llu %u %llu %u %u", &x.seq, &x.gpu, &x.xid, &x.gi, &x.ci) == 5)
                s->xids[s->nxids++] = x;
        } else if (strcmp(key, "missing") == 0) {
            if (s->nmissing < MAX_SLOW) snprintf(s->missing[s->nmissing++], 64, "%s", val);
        } else if (strcmp(key, "slow") == 0) {
            if (s->nslow < MAX_SLOW &&
                sscanf(val, "%63s %u", s->slow[s->nslow].fn, &s->slow[s->nslow].ms) == 2)
                s->nslow++;
        } else if (obj != NULL) {
            put(obj, key, val);
        } else if (strcmp(key, "time") == 0) {
            s->time = atof(val);
        } else if (strcmp(key, "timestamp_us") == 0) {
            s->timestamp_us = strtoull(val, NULL, 10);
        } else if (strcmp(key, "driver") == 0) {
            snprintf(s->driver, sizeof s->driver, "%s", val);
        } else if (strcmp(key, "loaded") == 0) {
            s->loaded = atoi(val);
        } else if (strcmp(key, "privileged") == 0) {
            s->privileged = atoi(val);
        } else if (strcmp(key, "pid_namespace") == 0) {
            s->host_pid_namespace = strcmp(val, "own") != 0;
        } else if (strcmp(key, "generation") == 0) {
            s->generation = (unsigned)strtoul(val, NULL, 10);
        }
    }
    return s;
}

/* Change notification for the state file's directory (inotify, as a real driver's state
 * needs no polling): calls check it with one non-blocking read() instead of a stat() each,
 * and nvmlEventSetWait blocks in poll() on its own watch rather than waking every few ms.
 * Without inotify (-1) every call stats the file, as before. Called with `mu` held. */
static int calls_watch = -1;
static char watched_path[sizeof state_path];

static int watch_state_dir(int flags) {
    char dir[sizeof state_path];
    snprintf(dir, sizeof dir, "%s", state_path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) slash[1] = 0;
    else *slash = 0;
    int fd = inotify_init1(IN_CLOEXEC | flags);
    if (fd < 0) return -1;
    if (inotify_add_watch(fd, dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE |
                                       IN_DELETE | IN_ATTRIB | IN_MODIFY) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Drains the watch; 1 when an event drained names the state file (or names no file), or,
 * with `any`, when there was any event at all. The writer's temporary file coming and
 * going in the same directory is not a change of state. */
static int drain_events(int fd, int any) {
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    const char *slash = strrchr(state_path, '/');
    const char *base = slash ? slash + 1 : state_path;
    int changed = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            if (any || ev->len == 0 || strcmp(ev->name, base) == 0) changed = 1;
            p += sizeof *ev + ev->len;
        }
    }
    return changed;
}

static int state_may_have_changed(void) {
    if (strcmp(watched_path, state_path) != 0) {
        if (calls_watch >= 0) close(calls_watch);
        calls_watch = watch_state_dir(IN_NONBLOCK);
        snprintf(watched_path, sizeof watched_path, "%s", state_path);
        return 1;
    }
    return calls_watch < 0 || drain_events(calls_watch, 1);
}

/* The writer (simulator/nvml.py) bumps a counter in `<state>.gen` after each
 * replace; mapped shared, it tells every call whether anything changed without a system
 * call (a real driver answers from its own memory too). Without the file, every call asks
 * inotify. Called with `mu` held. */
static const volatile unsigned long long *gen_map;
static unsigned long long gen_seen;
static char gen_for[sizeof state_path];

static int generation_unchanged(void) {
    if (strcmp(gen_for, state_path) != 0) {
        char path[sizeof state_path + 8];
        if (gen_map != NULL) munmap((void *)gen_map, sizeof *gen_map);
        gen_map = NULL;
        snprintf(gen_for, sizeof gen_for, "%s", state_path);
        snprintf(path, sizeof path, "%s.gen", state_path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            void *m = mmap(NULL, sizeof *gen_map, PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (m != MAP_FAILED) gen_map = m;
        }
        /* A new file counts from its own start: this call checks the state in full. */
        if (gen_map != NULL) gen_seen = __atomic_load_n(gen_map, __ATOMIC_ACQUIRE);
        return 0;
    }
    if (gen_map == NULL) return 0;
    unsigned long long g = __atomic_load_n(gen_map, __ATOMIC_ACQUIRE);
    if (g == gen_seen) return 1;
    gen_seen = g;
    return 0;
}

/* Re-read the state file when it was replaced. Called with `mu` held. The XID wait, woken
 * by the state file's own replacement (which comes before the writer's generation bump),
 * does not trust the generation. */
static void reload_if_changed(int trust_generation) {
    struct stat st;
    if (cur != NULL && trust_generation && generation_unchanged()) return;
    if (cur != NULL && !state_may_have_changed()) return;
    if (state_path[0] == 0 || stat(state_path, &st) != 0) {
        free_state(cur);
        cur = NULL;
        memset(&state_stat, 0, sizeof state_stat);
        return;
    }
    if (cur && st.st_ino == state_stat.st_ino && st.st_size == state_stat.st_size &&
        st.st_mtim.tv_sec == state_stat.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == state_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(state_path, "r");
    if (f == NULL) return;
    state_t *next = parse(f);
    fclose(f);
    if (next == NULL) return;
    free_state(cur);
    cur = next;
    state_stat = st;
}

static void reload(void) { reload_if_changed(1); }

/* Tests load the library once per test process; each simulated node is a new process
 * for the library (forget the version it mapped). Only while nobody holds NVML. */
EXPORT int fakenvml_new_process(void) {
    int done = 0;
    pthread_mutex_lock(&mu);
    if (refcount == 0) {
        lib_driver[0] = 0;
        done = 1;
    }
    pthread_mutex_unlock(&mu);
    return done;
}

/* ---------------------------------------------------------------- call entry */

static unsigned delay_ms(const char *fn) {
    unsigned ms = 0;
    if (cur == NULL) return 0;
    for (int i = 0; i < cur->nslow; i++)
        if (strcmp(cur->slow[i].fn, fn) == 0 || strcmp(cur->slow[i].fn, "*") == 0)
            ms += cur->slow[i].ms;
    return ms;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int mismatched(void) {
    return cur != NULL && lib_driver[0] != 0 && strcmp(cur->driver, lib_driver) != 0;
}

static int live(void) {
    return refcount > 0 && cur != NULL && cur->loaded && cur->generation == lib_generation &&
           !mismatched();
}

/* What a call answers when the library is not live. */
static nvmlReturn_t not_live(void) {
    return mismatched() ? NVML_ERROR_LIB_RM_VERSION_MISMATCH : NVML_ERROR_UNINITIALIZED;
}

static int is_missing(const char *fn) {
    for (int i = 0; cur != NULL && i < cur->nmissing; i++)
        if (strcmp(cur->missing[i], fn) == 0) return 1;
    return 0;
}

/* Count the call, apply an injected delay, then lock and refresh the state.
 * Returns with `mu` held: NVML_SUCCESS, or FUNCTION_NOT_FOUND for a "missing" function. */
static nvmlReturn_t enter(const char *fn) {
    unsigned ms;
    count_call(fn);
    pthread_mutex_lock(&mu);
    reload();
    ms = delay_ms(fn);
    if (ms) {
        pthread_mutex_unlock(&mu);
        sleep_ms(ms);
        pthread_mutex_lock(&mu);
        reload();
    }
    return is_missing(fn) ? NVML_ERROR_FUNCTION_NOT_FOUND : NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t r) {
    pthread_mutex_unlock(&mu);
    return r;
}

#define ENTER()                                    \
    do {                                           \
        nvmlReturn_t entered_ = enter(__func__);   \
        if (entered_ != NVML_SUCCESS) return leave(entered_); \
    } while (0)

/* The object a handle names: the GPU block or the MIG block. */
static nvmlReturn_t resolve(nvmlDevice_t dev, obj_t **obj, gpu_t **gpu) {
    if (!live()) return not_live();
    if (dev == NULL || dev->generation != lib_generation) return NVML_ERROR_INVALID_ARGUMENT;
    if (dev->gpu < 0 || dev->gpu >= init_ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    if (dev->gpu >= cur->ngpus) return NVML_ERROR_GPU_IS_LOST; /* gone from the bus */
    gpu_t *g = &cur->gpus[dev->gpu];
    if (get(&g->o, "lost")) return NVML_ERROR_GPU_IS_LOST;
    if (gpu) *gpu = g;
    if (dev->mig < 0) {
        *obj = &g->o;
        return NVML_SUCCESS;
    }
    const char *uuid = g->migs[dev->mig].present ? get(&g->migs[dev->mig].o, "uuid") : NULL;
    if (uuid == NULL || strcmp(uuid, dev->uuid) != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *obj = &g->migs[dev->mig].o;
    return NVML_SUCCESS;
}

/* The handle of the MIG device now in a slot (a new one when the slot was reconfigured).
 * Handles are never freed: a stale one must stay readable to be rejected. */
static nvmlDevice_t mig_handle(int gpu, int slot) {
    const char *uuid = get(&cur->gpus[gpu].migs[slot].o, "uuid");
    struct nvmlDevice_st *h = handles->migs[gpu][slot];
    if (uuid == NULL) uuid = "";
    if (h == NULL || strcmp(h->uuid, uuid) != 0) {
        h = calloc(1, sizeof *h);
        if (h == NULL) return NULL;
        *h = (struct nvmlDevice_st){gpu, slot, lib_generation, ""};
        snprintf(h->uuid, sizeof h->uuid, "%s", uuid);
        handles->migs[gpu][slot] = h;
    }
    return h;
}

#define DEVICE_CALL(dev)                                 \
    obj_t *o;                                            \
    gpu_t *g;                                            \
    nvmlReturn_t r;                                      \
    ENTER();                                             \
    r = resolve((dev), &o, &g);                          \
    if (r != NVML_SUCCESS) return leave(r);              \
    (void)g

#define CHECK_PTR(p) \
    if ((p) == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT)

/* Whether a value can be read: a missing key is NOT_SUPPORTED, "!<code>" an injected
 * error (a read that fails this time). */
static nvmlReturn_t status(const obj_t *o, const char *key) {
    const char *v = get(o, key);
    if (v == NULL) return NVML_ERROR_NOT_SUPPORTED;
    if (v[0] == '!') return (nvmlReturn_t)atoi(v + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t get_ull(const obj_t *o, const char *key, unsigned long long *out) {
    nvmlReturn_t r = status(o, key);
    if (r == NVML_SUCCESS) *out = strtoull(get(o, key), NULL, 10);
    return r;
}

static nvmlReturn_t get_uint(const obj_t *o, const char *key, unsigned int *out) {
    unsigned long long v;
    nvmlReturn_t r = get_ull(o, key, &v);
    if (r == NVML_SUCCESS) *out = (unsigned int)v;
    return r;
}

static nvmlReturn_t get_str(const obj_t *o, const char *key, char *out, unsigned int length) {
    const char *v = get(o, key);
    nvmlReturn_t r = status(o, key);
    if (r != NVML_SUCCESS) return r;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(v) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- init */

static nvmlReturn_t init_locked(void) {
    const char *path = getenv("KDE_FAKENVML_STATE");
    if (path == NULL || path[0] == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (strcmp(path, state_path) != 0) {
        snprintf(state_path, sizeof state_path, "%s", path);
        free_state(cur);
        cur = NULL;
    }
    reload();
    if (cur == NULL || !cur->loaded) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (mismatched()) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (lib_driver[0] == 0) snprintf(lib_driver, sizeof lib_driver, "%s", cur->driver);
    if (refcount == 0) init_ngpus = cur->ngpus;
    if (refcount == 0 || handles == NULL || lib_generation != cur->generation) {
        /* Never freed: stale handles must stay readable to be rejected. */
        handles_t *h = calloc(1, sizeof *h);
        if (h == NULL) return NVML_ERROR_MEMORY;
        for (int i = 0; i < MAX_GPUS; i++) h->gpus[i] = (struct nvmlDevice_st){i, -1, cur->generation, ""};
        handles = h;
        lib_generation = cur->generation;
    }
    refcount++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    ENTER();
    return leave(init_locked());
}

EXPORT nvmlReturn_t nvmlInit(void) { /* nvml.h maps this to nvmlInit_v2 */
    ENTER();
    return leave(init_locked());
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    ENTER();
    if (refcount == 0) return leave(NVML_ERROR_UNINITIALIZED);
    refcount--;
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(version);
    if (strlen(cur->driver) + 1 > length) return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    strcpy(version, cur->driver);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char v[96];
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(version);
    snprintf(v, sizeof v, "%d.%s", NVML_API_VERSION, cur->driver);
    if (strlen(v) + 1 > length) return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    strcpy(version, v);
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- enumeration */

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { /* -> _v2 */
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(deviceCount);
    *deviceCount = (unsigned)init_ngpus;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) { /* -> _v2 */
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(device);
    if (index >= (unsigned)init_ngpus) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned)cur->ngpus || get(&cur->gpus[index].o, "lost"))
        return leave(NVML_ERROR_GPU_IS_LOST);
    if (get(&cur->gpus[index].o, "no_access")) return leave(NVML_ERROR_NO_PERMISSION);
    *device = &handles->gpus[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(uuid);
    CHECK_PTR(device);
    for (int i = 0; i < cur->ngpus; i++) {
        const char *u = get(&cur->gpus[i].o, "uuid");
        if (u && strcmp(u, uuid) == 0) {
            if (get(&cur->gpus[i].o, "lost")) return leave(NVML_ERROR_GPU_IS_LOST);
            *device = &handles->gpus[i];
            return leave(NVML_SUCCESS);
        }
        for (int m = 0; m < MAX_MIGS; m++) {
            const char *mu_ = cur->gpus[i].migs[m].present ? get(&cur->gpus[i].migs[m].o, "uuid") : NULL;
            if (mu_ && strcmp(mu_, uuid) == 0) {
                *device = mig_handle(i, m);
                return leave(*device ? NVML_SUCCESS : NVML_ERROR_MEMORY);
            }
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

static int parse_bus_id(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn) {
    if (sscanf(s, "%x:%x:%x.%x", dom, bus, dev, fn) == 4) return 1;
    *dom = 0;
    return sscanf(s, "%x:%x.%x", bus, dev, fn) == 3;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) { /* -> _v2 */
    unsigned a[4], b[4];
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(pciBusId);
    CHECK_PTR(device);
    if (!parse_bus_id(pciBusId, &a[0], &a[1], &a[2], &a[3])) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < cur->ngpus; i++) {
        const char *p = get(&cur->gpus[i].o, "pci");
        if (p && parse_bus_id(p, &b[0], &b[1], &b[2], &b[3]) && memcmp(a, b, sizeof a) == 0) {
            if (get(&cur->gpus[i].o, "lost")) return leave(NVML_ERROR_GPU_IS_LOST);
            *device = &handles->gpus[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEVICE_CALL(device);
    CHECK_PTR(index);
    if (device->mig >= 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    *index = (unsigned)device->gpu;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL(device);
    return leave(get_str(o, "uuid", uuid, length));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL(device);
    return leave(get_str(o, "name", name, length));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEVICE_CALL(device);
    return leave(get_str(o, "serial", serial, length));
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    DEVICE_CALL(device);
    CHECK_PTR(minorNumber);
    return leave(get_uint(o, "minor", minorNumber));
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    unsigned dom, bus, dev, fn;
    const char *p;
    DEVICE_CALL(device);
    CHECK_PTR(pci);
    p = get(&g->o, "pci"); /* a MIG device answers with its parent's address */
    if (p == NULL || !parse_bus_id(p, &dom, &bus, &dev, &fn)) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, dom, bus, dev);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, dom, bus, dev);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    get_uint(&g->o, "pci_device_id", &pci->pciDeviceId);
    get_uint(&g->o, "pci_subsystem_id", &pci->pciSubSystemId);
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- MIG */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEVICE_CALL(device);
    CHECK_PTR(currentMode);
    CHECK_PTR(pendingMode);
    if (device->mig >= 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    r = get_uint(o, "mig_mode", currentMode);
    if (r == NVML_SUCCESS) *pendingMode = *currentMode;
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEVICE_CALL(device);
    CHECK_PTR(count);
    if (device->mig >= 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(get_uint(o, "max_mig_devices", count));
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    unsigned mode = 0;
    DEVICE_CALL(device);
    CHECK_PTR(migDevice);
    if (device->mig >= 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (get_uint(o, "mig_mode", &mode) != NVML_SUCCESS || mode == 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (index >= MAX_MIGS) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->migs[index].present) return leave(NVML_ERROR_NOT_FOUND);
    *migDevice = mig_handle(device->gpu, (int)index);
    return leave(*migDevice ? NVML_SUCCESS : NVML_ERROR_MEMORY);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    DEVICE_CALL(device);
    CHECK_PTR(isMigDevice);
    *isMigDevice = device->mig >= 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEVICE_CALL(device);
    CHECK_PTR(id);
    if (device->mig < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(get_uint(o, "gi", id));
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEVICE_CALL(device);
    CHECK_PTR(id);
    if (device->mig < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(get_uint(o, "ci", id));
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    DEVICE_CALL(migDevice);
    CHECK_PTR(device);
    if (migDevice->mig < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &handles->gpus[migDevice->gpu];
    return leave(NVML_SUCCESS);
}

/* GPU instances: the placement the driver gave a MIG device's GPU instance (how NVIDIA's
 * DRA driver finds the MIG device it created at prepare: dra-driver-nvidia-gpu
 * cmd/gpu-kubelet-plugin/nvlib.go FindMigDevBySpec, GetGpuInstanceById then GetInfo).
 * nvml.h: "Requires privileged user." for GetGpuInstanceById; GetInfo says NO_PERMISSION
 * may be answered. State keys of a MIG block: profile_id, placement_start, placement_size. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    unsigned mode = 0, gi = 0;
    DEVICE_CALL(device);
    CHECK_PTR(gpuInstance);
    if (device->mig >= 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (get_uint(o, "mig_mode", &mode) != NVML_SUCCESS || mode == 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!cur->privileged) return leave(NVML_ERROR_NO_PERMISSION);
    for (int slot = 0; slot < MAX_MIGS; slot++) {
        if (!g->migs[slot].present || get_uint(&g->migs[slot].o, "gi", &gi) != NVML_SUCCESS || gi != id)
            continue;
        nvmlDevice_t mig = mig_handle(device->gpu, slot);
        if (mig == NULL) return leave(NVML_ERROR_MEMORY);
        struct nvmlGpuInstance_st *h = handles->instances[device->gpu][slot];
        if (h == NULL || h->mig != mig) {
            h = calloc(1, sizeof *h);
            if (h == NULL) return leave(NVML_ERROR_MEMORY);
            h->mig = mig;
            handles->instances[device->gpu][slot] = h;
        }
        *gpuInstance = h;
        return leave(NVML_SUCCESS);
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    if (gpuInstance == NULL) {
        ENTER();
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    DEVICE_CALL(gpuInstance->mig);
    CHECK_PTR(info);
    if (!cur->privileged) return leave(NVML_ERROR_NO_PERMISSION);
    memset(info, 0, sizeof *info);
    info->device = &handles->gpus[gpuInstance->mig->gpu];
    if ((r = get_uint(o, "gi", &info->id)) != NVML_SUCCESS) return leave(r);
    if ((r = get_uint(o, "profile_id", &info->profileId)) != NVML_SUCCESS) return leave(r);
    if ((r = get_uint(o, "placement_start", &info->placement.start)) != NVML_SUCCESS) return leave(r);
    return leave(get_uint(o, "placement_size", &info->placement.size));
}

/* ---------------------------------------------------------------- memory, activity, power */

static nvmlReturn_t memory(const obj_t *o, unsigned long long *total, unsigned long long *reserved,
                           unsigned long long *used) {
    nvmlReturn_t r = get_ull(o, "memory_total", total);
    if (r != NVML_SUCCESS) return r;
    if (get_ull(o, "memory_reserved", reserved) != NVML_SUCCESS) *reserved = 0;
    return get_ull(o, "memory_used", used);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    unsigned long long total, reserved, used;
    DEVICE_CALL(device);
    CHECK_PTR(mem);
    r = memory(o, &total, &reserved, &used);
    if (r != NVML_SUCCESS) return leave(r);
    /* v1 counts the reserved memory as used, as the driver does */
    mem->total = total;
    mem->used = used + reserved;
    mem->free = total - used - reserved;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    unsigned long long total, reserved, used;
    DEVICE_CALL(device);
    CHECK_PTR(mem);
    if (mem->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    r = memory(o, &total, &reserved, &used);
    if (r != NVML_SUCCESS) return leave(r);
    mem->total = total;
    mem->reserved = reserved;
    mem->used = used;
    mem->free = total - used - reserved;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEVICE_CALL(device);
    CHECK_PTR(utilization);
    r = get_uint(o, "util_gpu", &utilization->gpu);
    if (r == NVML_SUCCESS) r = get_uint(o, "util_memory", &utilization->memory);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization, unsigned int *samplingPeriodUs) {
    DEVICE_CALL(device);
    CHECK_PTR(utilization);
    CHECK_PTR(samplingPeriodUs);
    *samplingPeriodUs = 167000;
    return leave(get_uint(o, "util_encoder", utilization));
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization, unsigned int *samplingPeriodUs) {
    DEVICE_CALL(device);
    CHECK_PTR(utilization);
    CHECK_PTR(samplingPeriodUs);
    *samplingPeriodUs = 167000;
    return leave(get_uint(o, "util_decoder", utilization));
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEVICE_CALL(device);
    CHECK_PTR(power);
    return leave(get_uint(o, "power_mw", power));
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEVICE_CALL(device);
    CHECK_PTR(limit);
    return leave(get_uint(o, "power_limit_mw", limit));
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    DEVICE_CALL(device);
    CHECK_PTR(energy);
    return leave(get_ull(o, "energy_mj", energy));
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    DEVICE_CALL(device);
    CHECK_PTR(temp);
    if (sensorType != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(get_uint(o, "temp_gpu", temp));
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    unsigned int t;
    DEVICE_CALL(device);
    CHECK_PTR(temperature);
    if (temperature->version != nvmlTemperature_v1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    r = get_uint(o, "temp_gpu", &t);
    if (r == NVML_SUCCESS) temperature->temperature = (int)t;
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    static const char *keys[] = {"clock_graphics", "clock_sm", "clock_memory", "clock_video"};
    DEVICE_CALL(device);
    CHECK_PTR(clock);
    if ((unsigned)type >= 4) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(get_uint(o, keys[type], clock));
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEVICE_CALL(device);
    CHECK_PTR(reasons);
    return leave(get_ull(o, "throttle", reasons));
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEVICE_CALL(device);
    CHECK_PTR(reasons);
    return leave(get_ull(o, "throttle", reasons));
}

/* ---------------------------------------------------------------- PCIe, ECC */

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    DEVICE_CALL(device);
    CHECK_PTR(value);
    return leave(get_uint(o, "pcie_replay", value));
}

/* Faithfully slow: the driver samples a byte counter over 20 ms. Exporters must not
 * call this on the collection cycle (the NVML source reads the PCIe count fields). */
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value) {
    unsigned long long rate;
    DEVICE_CALL(device);
    CHECK_PTR(value);
    r = get_ull(o, counter == NVML_PCIE_UTIL_TX_BYTES ? "pcie_tx_rate" : "pcie_rx_rate", &rate);
    pthread_mutex_unlock(&mu);
    sleep_ms(20);
    if (r == NVML_SUCCESS) *value = (unsigned)(rate / 1024);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEVICE_CALL(device);
    CHECK_PTR(eccCounts);
    (void)counterType;
    return leave(get_ull(o, errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "ecc_corrected" : "ecc_uncorrected",
                         eccCounts));
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred) {
    DEVICE_CALL(device);
    CHECK_PTR(corrRows);
    CHECK_PTR(uncRows);
    CHECK_PTR(isPending);
    CHECK_PTR(failureOccurred);
    r = get_uint(o, "remapped_cor", corrRows);
    if (r == NVML_SUCCESS) r = get_uint(o, "remapped_unc", uncRows);
    if (r == NVML_SUCCESS) r = get_uint(o, "remapped_pending", isPending);
    if (r == NVML_SUCCESS) r = get_uint(o, "remapped_failure", failureOccurred);
    return leave(r);
}

/* ---------------------------------------------------------------- field values */

typedef struct {
    unsigned id;
    const char *key;
    nvmlValueType_t type;
} field_t;

static const field_t fields[] = {
    {NVML_FI_DEV_ECC_SBE_VOL_TOTAL, "ecc_corrected", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_ECC_DBE_VOL_TOTAL, "ecc_uncorrected", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_ECC_SBE_AGG_TOTAL, "ecc_corrected", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_ECC_DBE_AGG_TOTAL, "ecc_uncorrected", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "nvlink_crc_flit", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, "nvlink_crc_data", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, "nvlink_replay", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "nvlink_recovery", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_MEMORY_TEMP, "temp_memory", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "energy_mj", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_NVLINK_LINK_COUNT, "nvlink_links", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replay", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "nvlink_tx_kib", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "nvlink_rx_kib", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_REMAPPED_COR, "remapped_cor", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_REMAPPED_UNC, "remapped_unc", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_REMAPPED_PENDING, "remapped_pending", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_REMAPPED_FAILURE, "remapped_failure", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_POWER_INSTANT, "power_mw", NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_tx_bytes", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_RX_BYTES, "pcie_rx_bytes", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
};

static int is_per_link(unsigned id) {
    return id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX || id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    DEVICE_CALL(device);
    CHECK_PTR(values);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        const field_t *f = NULL;
        unsigned long long x;
        for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
            if (fields[k].id == v->fieldId) f = &fields[k];
        v->timestamp = (long long)cur->timestamp_us;
        v->latencyUsec = 0;
        if (f == NULL) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        v->nvmlReturn = get_ull(o, f->key, &x);
        if (v->nvmlReturn != NVML_SUCCESS) continue;
        if (is_per_link(f->id) && v->scopeId != UINT_MAX) {
            unsigned links = 0;
            if (get_uint(o, "nvlink_links", &links) != NVML_SUCCESS || v->scopeId >= links) {
                v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
                continue;
            }
            x /= links;
        }
        v->valueType = f->type;
        if (f->type == NVML_VALUE_TYPE_UNSIGNED_INT)
            v->value.uiVal = (unsigned)x;
        else
            v->value.ullVal = x;
    }
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- processes */

static int proc_matches(nvmlDevice_t device, const obj_t *o, const proc_t *p) {
    unsigned gi, ci;
    if (device->mig < 0) return 1;
    if (get_uint(o, "gi", &gi) != NVML_SUCCESS || get_uint(o, "ci", &ci) != NVML_SUCCESS) return 0;
    return p->gi == gi && p->ci == ci;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    unsigned n = 0;
    DEVICE_CALL(device);
    CHECK_PTR(infoCount);
    if ((r = status(o, "processes")) != NVML_SUCCESS) return leave(r);
    if (device->mig < 0 && !cur->privileged) {
        unsigned mode;
        if (get_uint(o, "mig_mode", &mode) == NVML_SUCCESS && mode == 1)
            return leave(NVML_ERROR_NO_PERMISSION); /* aggregate MIG info needs privileges */
    }
    /* The driver hides processes the caller's PID namespace cannot see. */
    if (cur->host_pid_namespace)
        for (int i = 0; i < g->nprocs; i++) n += proc_matches(device, o, &g->procs[i]);
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return leave(n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    n = 0;
    for (int i = 0; i < g->nprocs && cur->host_pid_namespace; i++) {
        const proc_t *p = &g->procs[i];
        if (!proc_matches(device, o, p)) continue;
        infos[n].pid = p->pid;
        infos[n].usedGpuMemory = p->bytes;
        infos[n].gpuInstanceId = p->gi;
        infos[n].computeInstanceId = p->ci;
        n++;
    }
    *infoCount = n;
    return leave(NVML_SUCCESS);
}

/* A process list the stand-in keeps empty (same checks as the compute list). */
static nvmlReturn_t empty_process_list(const char *fn, nvmlDevice_t device, unsigned int *infoCount) {
    obj_t *o;
    gpu_t *g;
    nvmlReturn_t r = enter(fn);
    if (r != NVML_SUCCESS) return leave(r);
    if ((r = resolve(device, &o, &g)) != NVML_SUCCESS) return leave(r);
    CHECK_PTR(infoCount);
    if ((r = status(o, "processes")) != NVML_SUCCESS) return leave(r);
    *infoCount = 0;
    return leave(NVML_SUCCESS);
}

/* Graphics processes: the simulated GPUs are data-center parts running CUDA only, so the
 * list is empty (the call itself exists on every driver the exporter supports). */
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos) {
    (void)infos;
    return empty_process_list(__func__, device, infoCount);
}

/* MPS clients: the stand-in models no MPS control daemon, so none (a real MPS setup was
 * not available to measure what the three lists show together). */
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos) {
    (void)infos;
    return empty_process_list(__func__, device, infoCount);
}

/* Process utilization (behaviour.py: process-utilization-samples). Measured on an H100
 * (driver 580.159.04, `python -m bench.nvml_probe --load`): one sample per busy process
 * per call, the newest, whether lastSeenTimeStamp is 0 or a second old; NOT_FOUND when
 * nothing is newer than lastSeenTimeStamp. The stand-in samples every SAMPLE_PERIOD_US of
 * scenario time (from scenario time 0, so tests know where periods end) and leaves out
 * idle processes. The period is the stand-in's own. */
#define SAMPLE_PERIOD_US 500000ULL

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    unsigned n = 0, mode;
    unsigned long long base, newest;
    DEVICE_CALL(device);
    CHECK_PTR(processSamplesCount);
    if ((r = status(o, "process_utilization")) != NVML_SUCCESS) return leave(r);
    if (device->mig >= 0 || (get_uint(o, "mig_mode", &mode) == NVML_SUCCESS && mode == 1))
        return leave(NVML_ERROR_NOT_SUPPORTED); /* "not currently supported" under MIG */
    base = cur->timestamp_us - (unsigned long long)llround(cur->time * 1e6);
    newest = base + (cur->timestamp_us - base) / SAMPLE_PERIOD_US * SAMPLE_PERIOD_US;
    if (newest > lastSeenTimeStamp)
        for (int i = 0; i < g->nprocs; i++) n += g->procs[i].sm > 0 || g->procs[i].mem > 0;
    if (n == 0) return leave(NVML_ERROR_NOT_FOUND);
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    n = 0;
    for (int i = 0; i < g->nprocs; i++) {
        const proc_t *p = &g->procs[i];
        if (p->sm == 0 && p->mem == 0) continue;
        utilization[n].pid = p->pid;
        utilization[n].timeStamp = newest;
        utilization[n].smUtil = p->sm;
        utilization[n].memUtil = p->mem;
        utilization[n].encUtil = 0;
        utilization[n].decUtil = 0;
        n++;
    }
    *processSamplesCount = n;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- events */

#define SUPPORTED_EVENTS nvmlEventTypeXidCriticalError

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    struct nvmlEventSet_st *s;
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(set);
    s = calloc(1, sizeof *s);
    if (s == NULL) return leave(NVML_ERROR_MEMORY);
    s->watch = watch_state_dir(IN_NONBLOCK);
    /* Only events that happen after the set exists are delivered. */
    for (int i = 0; i < cur->nxids; i++)
        if (cur->xids[i].seq > s->cursor) s->cursor = cur->xids[i].seq;
    *set = s;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    DEVICE_CALL(device);
    CHECK_PTR(eventTypes);
    *eventTypes = device->mig < 0 ? SUPPORTED_EVENTS : 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    DEVICE_CALL(device);
    CHECK_PTR(set);
    if (device->mig >= 0 || (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)) return leave(NVML_ERROR_NOT_SUPPORTED);
    set->types[device->gpu] |= eventTypes;
    return leave(NVML_SUCCESS);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    double deadline = now_ms() + timeoutms;
    /* Forget changes seen before this call (ENTER's reload reads them), so that only a
     * state written from here on wakes the poll. */
    int watch = set != NULL ? set->watch : -1;
    if (watch >= 0) drain_events(watch, 1);
    ENTER();
    for (;;) {
        if (!live()) return leave(not_live());
        if (set == NULL || data == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
        const xid_t *next = NULL;
        for (int i = 0; i < cur->nxids; i++) {
            const xid_t *x = &cur->xids[i];
            if (x->seq > set->cursor && (next == NULL || x->seq < next->seq)) next = x;
        }
        if (next != NULL) {
            set->cursor = next->seq;
            /* Unprivileged, events of one GPU/compute instance are not reported
             * (behaviour.py: events-mig-unprivileged). */
            int visible = cur->privileged || next->gi == NO_ID;
            if (visible && next->gpu < MAX_GPUS && (set->types[next->gpu] & nvmlEventTypeXidCriticalError)) {
                data->device = &handles->gpus[next->gpu];
                data->eventType = nvmlEventTypeXidCriticalError;
                data->eventData = next->xid;
                data->gpuInstanceId = next->gi;
                data->computeInstanceId = next->ci;
                return leave(NVML_SUCCESS);
            }
            continue;
        }
        double left = deadline - now_ms();
        if (left <= 0) return leave(NVML_ERROR_TIMEOUT);
        pthread_mutex_unlock(&mu);
        if (watch >= 0) {
            struct pollfd pfd = {watch, POLLIN, 0};
            /* A real driver's wait sleeps in the kernel until an event: wake (and re-read
             * the state) only when the state file itself was replaced, once per write. */
            if (poll(&pfd, 1, (int)ceil(left)) > 0 && !drain_events(watch, 0)) {
                pthread_mutex_lock(&mu);
                continue;
            }
        } else {
            sleep_ms(left < 5 ? (unsigned)ceil(left) : 5);
        }
        pthread_mutex_lock(&mu);
        reload_if_changed(0);
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER();
    if (set != NULL && set->watch >= 0) close(set->watch);
    free(set);
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- GPM
 *
 * As nvml.h (PyPI nvidia-nvml-dev 13.5.37, include/nvml.h) documents GPM:
 *   14896-15347  nvmlGpmMetricId_t: the metric ids and their units (percent 0.0 - 100.0,
 *                MiB/sec), quoted at GPM_METRICS below
 *   15366-15377  nvmlGpmMetric_t: per metric metricId IN; nvmlReturn, value, metricInfo OUT
 *                ("If this is nonzero, then value is not valid")
 *   15382-15391  nvmlGpmMetricsGet_t, NVML_GPM_METRICS_GET_VERSION 1
 *   15396-15402  nvmlGpmSupport_t, NVML_GPM_SUPPORT_VERSION 1
 *   15413-15434  nvmlGpmMetricsGet: metrics from two samples of one device
 *   15467-15484  nvmlGpmSampleGet: "supports the device handle and MIG device handle"; two
 *                samples "should be greater than 100ms" apart
 *   15487-15505  nvmlGpmMigSampleGet: a sample of one MIG GPU instance, by its id
 *   15508-15522  nvmlGpmQueryDeviceSupport: device or MIG handle; "For Hopper or newer"
 * nvml.h does not say what a pair closer than 100 ms gives; here it is a rate like any other
 * (the exporter never takes such a pair on purpose: --collector.nvml.gpm-interval must exceed
 * 100 ms; a retry after a failed read is one collection interval later).
 */

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    DEVICE_CALL(device);
    CHECK_PTR(gpmSupport);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpmSupport->isSupportedDevice = status(&g->o, "gpm") == NVML_SUCCESS;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    if (gpmSample == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    count_call(__func__);
    *gpmSample = calloc(1, sizeof **gpmSample);
    return *gpmSample ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    count_call(__func__);
    free(gpmSample);
    return NVML_SUCCESS;
}

static nvmlReturn_t gpm_fill(const obj_t *o, int gpu, int gi, nvmlGpmSample_t s) {
    nvmlReturn_t r = status(o, "gpm_busy_s");
    if (r != NVML_SUCCESS) return r;
    s->valid = 1;
    s->gpu = gpu;
    s->gi = gi;
    s->time = cur->time;
    for (int i = 0; i < GPM_N; i++) {
        const char *v = get(o, GPM_COUNTERS[i]);
        s->counter[i] = v && v[0] != '!' ? atof(v) : NAN;
    }
    return NVML_SUCCESS;
}

/* nvml.h (nvmlGpmSampleGet): "This API supports the device handle and MIG device handle";
 * a MIG handle samples its GPU instance, as nvmlGpmMigSampleGet does. */
EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    unsigned gi = 0;
    DEVICE_CALL(device);
    CHECK_PTR(gpmSample);
    if ((r = status(&g->o, "gpm")) != NVML_SUCCESS) return leave(r);
    if (device->mig >= 0) {
        if ((r = get_uint(o, "gi", &gi)) != NVML_SUCCESS) return leave(r);
        return leave(gpm_fill(o, device->gpu, (int)gi, gpmSample));
    }
    return leave(gpm_fill(o, device->gpu, -1, gpmSample));
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample) {
    unsigned gi;
    DEVICE_CALL(device);
    CHECK_PTR(gpmSample);
    if (device->mig >= 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if ((r = status(&g->o, "gpm")) != NVML_SUCCESS) return leave(r);
    for (int m = 0; m < MAX_MIGS; m++)
        if (g->migs[m].present && get_uint(&g->migs[m].o, "gi", &gi) == NVML_SUCCESS && gi == gpuInstanceId)
            return leave(gpm_fill(&g->migs[m].o, device->gpu, (int)gi, gpmSample));
    return leave(NVML_ERROR_NOT_FOUND);
}

/* The metrics the stand-in computes: nvml.h's nvmlGpmMetricId_t, its comments quoted.
 * `percent`: 100 x (busy seconds / elapsed); otherwise bytes / elapsed, in MiB/sec. */
static const struct {
    unsigned id;
    int counter, percent;
    const char *name;
} GPM_METRICS[] = {
    /* "Percentage of time any compute/graphics app was active on the GPU. 0.0 - 100.0" */
    {NVML_GPM_METRIC_GRAPHICS_UTIL, GPM_GR, 1, "GR_UTIL"},
    /* "Percentage of SMs that were busy. 0.0 - 100.0" */
    {NVML_GPM_METRIC_SM_UTIL, GPM_SM, 1, "SM_UTIL"},
    /* "Percentage of warps that were active vs theoretical maximum. 0.0 - 100.0" */
    {NVML_GPM_METRIC_SM_OCCUPANCY, GPM_OCC, 1, "SM_OCCUPANCY"},
    /* "Percentage of time the GPU's SMs were doing ANY tensor operations. 0.0 - 100.0" */
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, GPM_TENSOR, 1, "ANY_TENSOR_UTIL"},
    /* "Percentage of time the GPU's SMs were doing non-tensor FP64/FP32/FP16 math." */
    {NVML_GPM_METRIC_FP64_UTIL, GPM_FP64, 1, "FP64_UTIL"},
    {NVML_GPM_METRIC_FP32_UTIL, GPM_FP32, 1, "FP32_UTIL"},
    {NVML_GPM_METRIC_FP16_UTIL, GPM_FP16, 1, "FP16_UTIL"},
    /* "Percentage of DRAM bw used vs theoretical maximum. 0.0 - 100.0" */
    {NVML_GPM_METRIC_DRAM_BW_UTIL, GPM_DRAM, 1, "DRAM_BW_UTIL"},
    /* "PCIe traffic from this GPU in MiB/sec" / "PCIe traffic to this GPU in MiB/sec" */
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, GPM_PCIE_TX, 0, "PCIE_TX_PER_SEC"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, GPM_PCIE_RX, 0, "PCIE_RX_PER_SEC"},
    /* "NvLink write bandwidth for all links in MiB/sec" / "NvLink read bandwidth ..." */
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, GPM_NVLINK_TX, 0, "NVLINK_TOTAL_TX_PER_SEC"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, GPM_NVLINK_RX, 0, "NVLINK_TOTAL_RX_PER_SEC"},
};

/* nvml.h (nvmlGpmMetricsGet): version NVML_GPM_METRICS_GET_VERSION, numMetrics entries of
 * metrics[] with metricId set; each gets its own nvmlReturn ("If this is nonzero, then
 * value is not valid"), the call itself succeeds. */
EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    const struct nvmlGpmSample_st *a, *b;
    double dt;
    ENTER();
    if (!live()) return leave(not_live());
    CHECK_PTR(m);
    if (m->version != NVML_GPM_METRICS_GET_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    a = m->sample1;
    b = m->sample2;
    if (a == NULL || b == NULL || !a->valid || !b->valid || a->gpu != b->gpu || a->gi != b->gi ||
        m->numMetrics > NVML_GPM_METRIC_MAX)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    dt = b->time - a->time;
    for (unsigned i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        size_t k = 0;
        double delta;
        while (k < sizeof GPM_METRICS / sizeof GPM_METRICS[0] && GPM_METRICS[k].id != x->metricId) k++;
        if (k == sizeof GPM_METRICS / sizeof GPM_METRICS[0]) {
            x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        x->metricInfo.shortName = x->metricInfo.longName = (char *)GPM_METRICS[k].name;
        x->metricInfo.unit = GPM_METRICS[k].percent ? "%" : "MiB/sec";
        delta = b->counter[GPM_METRICS[k].counter] - a->counter[GPM_METRICS[k].counter];
        if (dt <= 0 || isnan(delta)) {
            x->nvmlReturn = isnan(delta) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
            continue;
        }
        x->value = GPM_METRICS[k].percent ? fmin(100.0, fmax(0.0, 100.0 * delta / dt))
                                          : fmax(0.0, delta / dt / (1024.0 * 1024.0));
        x->nvmlReturn = NVML_SUCCESS;
    }
    return leave(NVML_SUCCESS);
}
