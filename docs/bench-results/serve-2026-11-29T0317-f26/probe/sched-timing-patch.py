p='/work/main/src/server/sched.c'
s=open(p).read()
s=s.replace("""        if (slot_start(s, sl, err, sizeof err)) {
            pthread_mutex_lock(&s->lock);""","""        double T0 = srv_now();
        if (slot_start(s, sl, err, sizeof err)) {
            pthread_mutex_lock(&s->lock);""",1)
s=s.replace("""        if (!slot_reuse_kept(s, sl, q->pc.nb)) slot_reuse_prefix(s, &q->pc, q->kd, sl);
        sl->cached = sl->fed;""","""        double T1 = srv_now();
        if (!slot_reuse_kept(s, sl, q->pc.nb)) slot_reuse_prefix(s, &q->pc, q->kd, sl);
        double T2 = srv_now();
        fprintf(stderr, "ADMIT %.3f slot %d start %.1f ms reuse %.1f ms fed %d\\n", T0, i, (T1-T0)*1e3, (T2-T1)*1e3, sl->fed);
        sl->cached = sl->fed;""",1)
s=s.replace("""    if (nc > 1) {
        rc = slots_prefill_tails(q->s, q->chunk, nc, q->bc, q->btok, q->blogits);""","""    double T0 = srv_now();
    if (nc > 1) {
        rc = slots_prefill_tails(q->s, q->chunk, nc, q->bc, q->btok, q->blogits);
        fprintf(stderr, "TAILS %.3f %d %.1f ms\\n", T0, nc, (srv_now()-T0)*1e3);""",1)
open(p,'w').write(s)
s=open(p).read()
s=s.replace("""    const int rc = sparq_decode_batch(q->bc, q->btok, nb, q->blogits);""","""    double TD = srv_now();
    const int rc = sparq_decode_batch(q->bc, q->btok, nb, q->blogits);
    fprintf(stderr, "STEP %.3f nb %d %.1f ms\\n", TD, nb, (srv_now()-TD)*1e3);""",1)
open(p,'w').write(s)
