/* kv_writer.h - the --kv-dir writer thread. Files are written on one
 * writer thread per server, so that neither the request whose prefill
 * made the prefix (its first token) nor the other running sequences wait
 * for hundreds of MiB to reach the disk. The scheduler hands over a
 * private copy of the prefix (a memory copy, far cheaper than the file;
 * the cache's shared copy is laid out for contexts of the server's
 * capacity, and a file is written for exactly n positions) and continues.
 * The queue is small and bounded: when it is full the write is skipped
 * (counted), never waited for. At shutdown the writer finishes what is
 * queued (at most KVW_QUEUE files) before the scheduler returns, but
 * starts none later than KVW_DRAIN_SECONDS after the stop (those are
 * counted as skipped): the replica's stop stays well within a
 * supervisor's (systemd: 60 s) even on a slow shared filesystem. Each
 * write goes to a temp name renamed into place (kvdir_save) and a write
 * once started is finished or its temp file removed, so no file is ever
 * seen half written and none is left behind. */
#ifndef SPARQ_SRV_KV_WRITER_H
#define SPARQ_SRV_KV_WRITER_H

#include "server/srv_internal.h"
#include "server/kvdir.h"

enum { KVW_QUEUE = 4, KVW_DRAIN_SECONDS = 20 };

typedef struct kv_job {
    sparq_context *c;        /* exactly the n prefix positions, owned      */
    int32_t       *ids;      /* owned copy of the n token ids              */
    int            n, replace;
    char           id[SRV_MAX_PREFIX_ID + 1]; /* "" : named by the tokens  */
} kv_job;

typedef struct kv_writer {
    srv_server     *s;
    srv_kvdir      *kd;
    pthread_t       th;
    int             started;
    pthread_mutex_t mu;      /* guards q, head, n, stop, stop_at (never held with s->lock) */
    pthread_cond_t  cv;
    kv_job          q[KVW_QUEUE];
    int             head, n, stop;
    double          stop_at; /* srv_now() when stop was set             */
} kv_writer;

/* Starts the writer; without it (thread creation failed) writes happen on
 * the scheduler thread, as they did before. */
void kv_writer_start(kv_writer *w, srv_server *s, srv_kvdir *kd);
/* Finishes the queued writes (those it can start within
 * KVW_DRAIN_SECONDS) and stops the writer. */
void kv_writer_stop(kv_writer *w);
/* --kv-dir: queues the first n tokens of src's cache to be saved as a
 * file, unless one is there already (from this replica or another); id:
 * under that name (replace: even if there, when it holds another
 * document). Skipped (counted) if the writer's queue is full. The
 * scheduler thread alone calls it. */
void kv_save_prefix(srv_server *s, kv_writer *w, const sparq_context *src, const int32_t *ids, int n, const char *id,
                    int replace);

#endif
