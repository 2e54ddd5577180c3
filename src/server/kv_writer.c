/* kv_writer.c - the --kv-dir writer thread (kv_writer.h). */
#include "server/kv_writer.h"
#include "util/err.h"

#include <limits.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kv_job_free(kv_job *j)
{
    sparq_context_free(j->c);
    free(j->ids);
    memset(j, 0, sizeof *j);
}

/* Writes one job's file and counts it. Any thread (the writer's, or the
 * scheduler's when the writer could not start). */
static void kv_job_run(srv_server *s, srv_kvdir *kd, kv_job *j)
{
    char err[256];
    int evicted = 0;
    const int rc = kvdir_save(kd, j->c, j->ids, j->n, j->id[0] ? j->id : NULL, j->replace, &evicted, err, sizeof err);
    if (rc < 0) fprintf(stderr, "serve: kv-dir: %s\n", err);
    pthread_mutex_lock(&s->lock);
    s->metrics.kv_dir_writes += rc > 0;
    s->metrics.kv_dir_errors += rc < 0;
    s->metrics.kv_dir_evictions += evicted;
    pthread_mutex_unlock(&s->lock);
}

static void *kv_writer_main(void *arg)
{
    kv_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->n && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->n) break; /* stopping, and everything queued is written */
        kv_job j = w->q[w->head];
        memset(&w->q[w->head], 0, sizeof w->q[0]);
        w->head = (w->head + 1) % KVW_QUEUE;
        w->n--;
        const int late = w->stop && srv_now() - w->stop_at > KVW_DRAIN_SECONDS;
        pthread_mutex_unlock(&w->mu);
        if (!late) kv_job_run(w->s, w->kd, &j);
        kv_job_free(&j);
        pthread_mutex_lock(&w->s->lock);
        w->s->metrics.kv_dir_pending--;
        w->s->metrics.kv_dir_skipped += late;
        pthread_mutex_unlock(&w->s->lock);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void kv_writer_start(kv_writer *w, srv_server *s, srv_kvdir *kd)
{
    memset(w, 0, sizeof *w);
    w->s = s;
    w->kd = kd;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->started = pthread_create(&w->th, NULL, kv_writer_main, w) == 0;
    if (!w->started) fprintf(stderr, "serve: kv-dir: no writer thread; files are written by the scheduler\n");
}

void kv_writer_stop(kv_writer *w)
{
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        w->stop_at = srv_now();
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

void kv_save_prefix(srv_server *s, kv_writer *w, const sparq_context *src, const int32_t *ids, int n, const char *id,
                    int replace)
{
    char path[PATH_MAX], err[256];
    srv_kvdir *kd = w->kd;
    if (id) kvdir_path_named(kd, id, path, sizeof path);
    else kvdir_path(kd, ids, n, path, sizeof path);
    if (!replace && access(path, F_OK) == 0) return;
    if (w->started) { /* only this thread queues: a free place stays free */
        pthread_mutex_lock(&w->mu);
        const int full = w->n == KVW_QUEUE;
        pthread_mutex_unlock(&w->mu);
        if (full) {
            pthread_mutex_lock(&s->lock);
            s->metrics.kv_dir_skipped++;
            pthread_mutex_unlock(&s->lock);
            return;
        }
    }
    kv_job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    j.replace = replace;
    if (id) snprintf(j.id, sizeof j.id, "%s", id);
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n;
    cp.n_threads = 1;
    cp.kv_type = s->cfg.kv_type;
    j.ids = malloc((size_t)n * sizeof *ids);
    if (!j.ids) err_set(err, sizeof err, "out of memory for a prefix file's token ids");
    if (!j.ids || sparq_context_create(s->model, &cp, &j.c, err, sizeof err) ||
        sparq_context_copy_prefix(j.c, src, n, err, sizeof err)) {
        fprintf(stderr, "serve: kv-dir: %s\n", err);
        kv_job_free(&j);
        pthread_mutex_lock(&s->lock);
        s->metrics.kv_dir_errors++;
        pthread_mutex_unlock(&s->lock);
        return;
    }
    memcpy(j.ids, ids, (size_t)n * sizeof *ids);
    if (!w->started) {
        kv_job_run(s, kd, &j);
        kv_job_free(&j);
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->metrics.kv_dir_pending++; /* before the writer can finish it */
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_lock(&w->mu);
    w->q[(w->head + w->n) % KVW_QUEUE] = j;
    w->n++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
