/*
 * The hot path of Memkit::FiberPool in C: #run, the pooled fibers' loop, and
 * the bookkeeping both touch. lib/memkit/fiber_pool.rb has the same thing in
 * Ruby (FiberPool::RubyCore), which is used when this file is not compiled
 * and is the reference for what every line here must do.
 *
 * Why C: on Ruby 3.1 every instance-variable access and method call in the
 * loop costs about as much as the fiber switch it wraps, so the Ruby pool
 * runs a job only ~1.15x as fast as Fiber.new { job }.resume; a Ruby pool
 * with no hygiene at all reached 1.36x (bench/RESULTS.md). Here the state is
 * a C struct and the only per-job calls are the switch, the job itself and
 * Thread#keys.
 *
 * Rare paths (a suspended job, a Fiber scheduler, fiber storage on 3.2+,
 * error messages) call back into the Ruby methods they share with RubyCore.
 */
#include <ruby.h>

typedef struct {
    VALUE thread;   /* owner: fibers cannot be resumed from another thread */
    VALUE hot;      /* the most recently parked fiber, or nil */
    VALUE idle;     /* Array of other parked fibers */
    VALUE args;     /* the running job's arguments, or nil (none) */
    VALUE storage;  /* the caller's Fiber storage for the next job (3.2+), or nil */
    VALUE waiting;  /* {fiber => Thread::Queue} for callers under a scheduler, or nil */
    long live, max_idle, max;
    int done, failed, keep_hot;
} pool_t;

static VALUE eExhausted, eInvalidArgument, cQueue, cFiber;
static ID id_new, id_keys, id_owner_bang, id_suspended, id_storage, id_clear_storage, id_restore_storage, id_push,
    id_max_idle, id_max;
static int storage_p; /* FiberPool::STORAGE: Fiber[] and Fiber#storage exist (Ruby 3.2+) */

/* rb_gc_mark pins what it marks: the struct's VALUEs never move under GC.compact. */
static void pool_mark(void *ptr)
{
    pool_t *p = ptr;
    rb_gc_mark(p->thread);
    rb_gc_mark(p->hot);
    rb_gc_mark(p->idle);
    rb_gc_mark(p->args);
    rb_gc_mark(p->storage);
    rb_gc_mark(p->waiting);
}

static const rb_data_type_t pool_type = {
    "Memkit::FiberPool",
    {pool_mark, RUBY_TYPED_DEFAULT_FREE, NULL},
    0, 0, RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE pool_alloc(VALUE klass)
{
    pool_t *p;
    VALUE self = TypedData_Make_Struct(klass, pool_t, &pool_type, p);
    p->thread = p->hot = p->idle = p->args = p->storage = p->waiting = Qnil;
    return self;
}

static pool_t *get_pool(VALUE self)
{
    return RTYPEDDATA_DATA(self);
}

/* Called by FiberPool#initialize once the options are checked. */
static VALUE pool_setup(VALUE self)
{
    pool_t *p = get_pool(self);
    p->max_idle = NUM2LONG(rb_ivar_get(self, id_max_idle));
    p->max = NUM2LONG(rb_ivar_get(self, id_max));
    p->keep_hot = p->max_idle > 0;
    p->thread = rb_thread_current();
    p->hot = Qnil;
    p->idle = rb_ary_new();
    p->live = 0;
    p->done = p->failed = 0;
    return self;
}

struct job_call {
    VALUE job, args;
};

static VALUE call_job(VALUE arg)
{
    struct job_call *c = (struct job_call *)arg;
    if (NIL_P(c->args)) return rb_proc_call_with_block(c->job, 0, NULL, Qnil);
    return rb_proc_call_with_block(c->job, RARRAY_LENINT(c->args), RARRAY_CONST_PTR(c->args), Qnil);
}

/* Fiber-locals (Thread.current[:x] is per fiber) must not reach the next job. */
static void clear_fiber_locals(VALUE thread)
{
    VALUE keys = rb_funcall(thread, id_keys, 0);
    long i, n = RARRAY_LEN(keys);
    for (i = 0; i < n; i++) rb_thread_local_aset(thread, rb_sym2id(RARRAY_AREF(keys, i)), Qnil);
}

static VALUE fiber_body(RB_BLOCK_CALL_FUNC_ARGLIST(job, self))
{
    pool_t *p = get_pool(self);
    VALUE fiber = rb_fiber_current();
    VALUE thread = rb_thread_current();
    if (storage_p) rb_funcall(self, id_clear_storage, 0); /* Fiber.new copied its creator's storage */
    for (;;) {
        struct job_call c;
        int state = 0, keep;
        VALUE value, queue;

        if (storage_p && !NIL_P(p->storage)) {
            VALUE storage = p->storage;
            p->storage = Qnil;
            rb_funcall(self, id_restore_storage, 1, storage);
        }
        c.job = job;
        c.args = p->args;
        p->args = Qnil;
        value = rb_protect(call_job, (VALUE)&c, &state);
        if (state) {
            value = rb_errinfo();
            /* Not an exception (a thread being killed): let it unwind as it would inline. */
            if (!rb_obj_is_kind_of(value, rb_eException)) rb_jump_tag(state);
            rb_set_errinfo(Qnil);
            p->failed = 1;
        }
        RB_GC_GUARD(c.job);
        RB_GC_GUARD(c.args);
        job = Qnil;
        clear_fiber_locals(thread);
        if (storage_p) rb_funcall(self, id_clear_storage, 0);

        if (NIL_P(p->hot) && p->keep_hot) {
            p->hot = fiber;
            keep = 1;
        } else if ((keep = RARRAY_LEN(p->idle) + 1 < p->max_idle)) {
            rb_ary_push(p->idle, fiber);
        } else {
            p->live--;
        }
        if (!NIL_P(p->waiting) && !NIL_P(queue = rb_hash_lookup(p->waiting, fiber))) {
            /* Our caller waits on a queue (FiberPool#suspended): hand it the
             * outcome there, then yield to whoever resumed us, the scheduler. */
            rb_hash_delete(p->waiting, fiber);
            if (RHASH_SIZE(p->waiting) == 0) p->waiting = Qnil;
            rb_funcall(queue, id_push, 1, rb_assoc_new(p->failed ? Qtrue : Qfalse, value));
            p->failed = 0;
            if (!keep) return Qnil;
            job = rb_fiber_yield(0, NULL);
        } else {
            p->done = 1;
            if (!keep) return value;
            job = rb_fiber_yield(1, &value);
        }
    }
    UNREACHABLE_RETURN(Qnil);
}

static VALUE spawn(VALUE self, pool_t *p)
{
    VALUE fiber;
    if (p->live >= p->max)
        rb_raise(eExhausted, "FiberPool: all %ld fibers are busy (max: %ld): that many jobs are nested or suspended",
                 p->max, p->max);
    /* Through Fiber.new rather than rb_fiber_new, which makes a blocking
     * fiber: a job in it could not wait on a Fiber scheduler. */
    fiber = rb_funcall_with_block(cFiber, id_new, 0, NULL, rb_proc_new(fiber_body, self));
    /* Counted once made: Fiber.new fails when the process is out of
     * mappings (vm.max_map_count), and that fiber never lived. */
    p->live++;
    return fiber;
}

/* FiberPool#run(*args) { |*args| job } */
static VALUE pool_run(int argc, VALUE *argv, VALUE self)
{
    pool_t *p = get_pool(self);
    VALUE job, fiber, value;

    if (!rb_block_given_p()) rb_raise(eInvalidArgument, "FiberPool#run needs a block");
    /* Checked first: resuming across threads would raise FiberError. */
    if (p->thread != rb_thread_current()) rb_funcall(self, id_owner_bang, 1, p->thread);
    job = rb_block_proc();
    fiber = p->hot;
    if (!NIL_P(fiber)) {
        p->hot = Qnil;
    } else {
        fiber = rb_ary_pop(p->idle);
        if (NIL_P(fiber)) fiber = spawn(self, p);
    }
    if (argc > 0) p->args = rb_ary_new_from_values(argc, argv);
    if (storage_p) p->storage = rb_funcall(rb_fiber_current(), id_storage, 0);
    /* Stale only if someone else resumed a suspended job to its end. */
    p->done = 0;
    value = rb_fiber_resume(fiber, 1, &job);
    if (p->done) {
        p->done = 0;
        if (!p->failed) return value;
        p->failed = 0;
        rb_exc_raise(value);
    }
    return rb_funcall(self, id_suspended, 2, fiber, value);
}

static VALUE pool_size(VALUE self)
{
    return LONG2NUM(get_pool(self)->live);
}

static VALUE pool_idle(VALUE self)
{
    pool_t *p = get_pool(self);
    return LONG2NUM(RARRAY_LEN(p->idle) + (NIL_P(p->hot) ? 0 : 1));
}

/* In a fork child: see RubyCore#after_fork. */
static VALUE pool_after_fork(VALUE self)
{
    pool_t *p = get_pool(self);
    p->live -= RARRAY_LEN(p->idle) + (NIL_P(p->hot) ? 0 : 1);
    p->hot = Qnil;
    p->idle = rb_ary_new();
    p->waiting = Qnil;
    p->thread = rb_thread_current();
    return self;
}

/* The state FiberPool#suspended reads and changes (RubyCore has the same). */
static VALUE pool_done_p(VALUE self)
{
    return get_pool(self)->done ? Qtrue : Qfalse;
}

static VALUE pool_take_failed(VALUE self)
{
    pool_t *p = get_pool(self);
    int failed = p->failed;
    p->done = p->failed = 0;
    return failed ? Qtrue : Qfalse;
}

static VALUE pool_lost_fiber(VALUE self)
{
    get_pool(self)->live--;
    return Qnil;
}

static VALUE pool_wait_queue(VALUE self, VALUE fiber)
{
    pool_t *p = get_pool(self);
    VALUE queue = rb_class_new_instance(0, NULL, cQueue);
    if (NIL_P(p->waiting)) p->waiting = rb_hash_new();
    rb_hash_aset(p->waiting, fiber, queue);
    return queue;
}

/* Memkit::Native.install_fiber_pool(FiberPool): lib/memkit/fiber_pool.rb calls it
 * once its constants (Exhausted, STORAGE) exist. */
static VALUE install_fiber_pool(VALUE mNative, VALUE cPool)
{
    VALUE mMemkit = rb_define_module("Memkit");

    eExhausted = rb_const_get(cPool, rb_intern("Exhausted"));
    eInvalidArgument = rb_const_get(mMemkit, rb_intern("InvalidArgument"));
    cQueue = rb_path2class("Thread::Queue");
    cFiber = rb_path2class("Fiber");
    /* Held in C statics: pinned, so GC.compact (Memkit.warmup) cannot move them. */
    rb_gc_register_mark_object(eExhausted);
    rb_gc_register_mark_object(eInvalidArgument);
    rb_gc_register_mark_object(cQueue);
    rb_gc_register_mark_object(cFiber);
    storage_p = RTEST(rb_const_get(cPool, rb_intern("STORAGE")));
    id_new = rb_intern("new");
    id_keys = rb_intern("keys");
    id_owner_bang = rb_intern("owner!");
    id_suspended = rb_intern("suspended");
    id_storage = rb_intern("storage");
    id_clear_storage = rb_intern("clear_storage");
    id_restore_storage = rb_intern("restore_storage");
    id_push = rb_intern("push");
    id_max_idle = rb_intern("@max_idle");
    id_max = rb_intern("@max");

    rb_define_alloc_func(cPool, pool_alloc);
    rb_define_method(cPool, "run", pool_run, -1);
    rb_define_method(cPool, "size", pool_size, 0);
    rb_define_method(cPool, "idle", pool_idle, 0);
    rb_define_private_method(cPool, "setup", pool_setup, 0);
    rb_define_private_method(cPool, "after_fork", pool_after_fork, 0);
    rb_define_private_method(cPool, "done?", pool_done_p, 0);
    rb_define_private_method(cPool, "take_failed", pool_take_failed, 0);
    rb_define_private_method(cPool, "lost_fiber", pool_lost_fiber, 0);
    rb_define_private_method(cPool, "wait_queue", pool_wait_queue, 1);
    return Qtrue;
}

void memkit_init_fiber_pool(VALUE mNative)
{
    rb_define_module_function(mNative, "install_fiber_pool", install_fiber_pool, 1);
}
