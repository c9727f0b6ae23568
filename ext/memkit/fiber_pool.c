/*
 * Memkit::FiberPool::NativeCore: a whole FiberPool core in C, a sibling of
 * FiberPool::RubyCore (lib/memkit/fiber_pool/ruby_core.rb), which is the
 * reference for what every function here must do. lib/memkit/fiber_pool.rb
 * picks one of the two once; MEMKIT_NATIVE=0 picks the Ruby one.
 *
 * Why C: on Ruby 3.1 every instance-variable access and method call in the
 * loop costs about as much as the fiber switch it wraps, so the Ruby core
 * runs a job 1.24x as fast as Fiber.new { job }.resume and this one 1.87x,
 * against a goal of 1.5x (docs/BENCHMARKS.md). Here the state is a C struct
 * and the only per-job calls are the switch, the job itself and Thread#keys.
 *
 * It calls only public Ruby API (Fiber, Thread::Queue, Fiber storage), never
 * a method of the pool's Ruby code: the rare paths (a suspended job, a Fiber
 * scheduler, fiber storage on 3.2+, error messages) are here too.
 */
#include <ruby.h>
#include <ruby/fiber/scheduler.h>

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

static VALUE eError, eExhausted, eInvalidArgument, eFiberError, cQueue, cFiber;
static ID id_new, id_keys, id_storage, id_aset, id_push, id_pop, id_raise, id_blocking_p;
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
    "Memkit::FiberPool::NativeCore",
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

/* setup(max_idle, max): called by FiberPool#initialize once the options are checked. */
static VALUE pool_setup(VALUE self, VALUE max_idle, VALUE max)
{
    pool_t *p = get_pool(self);
    p->max_idle = NUM2LONG(max_idle);
    p->max = NUM2LONG(max);
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

static int set_storage_key(VALUE key, VALUE value, VALUE clear)
{
    rb_funcall(cFiber, id_aset, 2, key, RTEST(clear) ? Qnil : value);
    return ST_CONTINUE;
}

/* Fiber.current.storage&.each_key { |key| Fiber[key] = nil } */
static void clear_storage(void)
{
    VALUE storage = rb_funcall(rb_fiber_current(), id_storage, 0);
    if (RB_TYPE_P(storage, T_HASH)) rb_hash_foreach(storage, set_storage_key, Qtrue);
}

/* storage.each { |key, value| Fiber[key] = value } */
static void restore_storage(VALUE storage)
{
    if (RB_TYPE_P(storage, T_HASH)) rb_hash_foreach(storage, set_storage_key, Qfalse);
}

static void owner_bang(VALUE owner)
{
    VALUE current = rb_thread_current();
    if (owner == current) return;
    rb_raise(eError,
             "FiberPool belongs to %" PRIsVALUE " and was used from %" PRIsVALUE ": "
             "fibers cannot move between threads, so create one pool per thread",
             rb_inspect(owner), rb_inspect(current));
}

static VALUE fiber_body(RB_BLOCK_CALL_FUNC_ARGLIST(job, self))
{
    pool_t *p = get_pool(self);
    VALUE fiber = rb_fiber_current();
    VALUE thread = rb_thread_current();
    if (storage_p) clear_storage(); /* Fiber.new copied its creator's storage */
    for (;;) {
        struct job_call c;
        int state = 0, keep;
        VALUE value, queue;

        if (storage_p && !NIL_P(p->storage)) {
            VALUE storage = p->storage;
            p->storage = Qnil;
            restore_storage(storage);
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
        if (storage_p) clear_storage();

        if (NIL_P(p->hot) && p->keep_hot) {
            p->hot = fiber;
            keep = 1;
        } else if ((keep = RARRAY_LEN(p->idle) + 1 < p->max_idle)) {
            rb_ary_push(p->idle, fiber);
        } else {
            p->live--;
        }
        if (!NIL_P(p->waiting) && !NIL_P(queue = rb_hash_lookup(p->waiting, fiber))) {
            /* Our caller waits on a queue (suspended()): hand it the
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

struct yield_state {
    VALUE value, error;
    int raised;
};

static VALUE yield_to_caller(VALUE arg)
{
    struct yield_state *s = (struct yield_state *)arg;
    return rb_fiber_yield(1, &s->value);
}

static VALUE yield_failed(VALUE arg, VALUE error)
{
    struct yield_state *s = (struct yield_state *)arg;
    s->raised = 1;
    s->error = error;
    return Qnil;
}

/*
 * The job suspended its fiber before finishing. The fiber stays with the job
 * (it is not idle) until the job is done; meanwhile #run waits the way the
 * job would have waited inline. RubyCore#suspended line by line.
 */
static VALUE suspended(pool_t *p, VALUE fiber, VALUE value)
{
    if (!RTEST(rb_fiber_alive_p(fiber))) {
        p->live--;
        rb_raise(eError, "FiberPool: a job ended its own fiber (Fiber#kill?) before returning");
    }
    if (!NIL_P(rb_fiber_scheduler_get())) {
        VALUE queue, outcome;
        if (RTEST(rb_funcall(rb_fiber_current(), id_blocking_p, 0)))
            rb_raise(eError, "FiberPool: the job is waiting on the Fiber scheduler, but #run was called from a "
                             "blocking fiber, which cannot wait for it; call #run inside Fiber.schedule { }");
        /* The scheduler resumes the job's fiber itself, not us. Wait on a
         * queue, which the scheduler understands, until the job finishes. */
        queue = rb_class_new_instance(0, NULL, cQueue);
        if (NIL_P(p->waiting)) p->waiting = rb_hash_new();
        rb_hash_aset(p->waiting, fiber, queue);
        outcome = rb_funcall(queue, id_pop, 0);
        Check_Type(outcome, T_ARRAY);
        if (RTEST(RARRAY_AREF(outcome, 0))) rb_exc_raise(RARRAY_AREF(outcome, 1));
        return RARRAY_AREF(outcome, 1);
    }
    /* No scheduler: the job yielded a value to our caller, as an inline
     * Fiber.yield would. Pass it on, and pass the reply back in. */
    while (!p->done) {
        struct yield_state s;
        VALUE reply;
        s.value = value;
        s.error = Qnil;
        s.raised = 0;
        reply = rb_rescue2(yield_to_caller, (VALUE)&s, yield_failed, (VALUE)&s, eFiberError, (VALUE)0);
        if (s.raised) {
            /* Inline, Fiber.yield from the root fiber raises inside the job. */
            value = rb_funcall(fiber, id_raise, 1, s.error);
            continue;
        }
        value = rb_fiber_resume(fiber, 1, &reply);
    }
    p->done = 0;
    if (p->failed) {
        p->failed = 0;
        rb_exc_raise(value);
    }
    return value;
}

/* FiberPool#run(*args) { |*args| job } */
static VALUE pool_run(int argc, VALUE *argv, VALUE self)
{
    pool_t *p = get_pool(self);
    VALUE job, fiber, value;

    if (!rb_block_given_p()) rb_raise(eInvalidArgument, "FiberPool#run needs a block");
    /* Checked first: resuming across threads would raise FiberError. */
    owner_bang(p->thread);
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
    return suspended(p, fiber, value);
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

/* Memkit::Native.define_fiber_pool_core(FiberPool) defines and returns FiberPool::NativeCore;
 * lib/memkit/fiber_pool.rb calls it once its constants (Exhausted, STORAGE) exist. */
static VALUE define_fiber_pool_core(VALUE mNative, VALUE cPool)
{
    VALUE mMemkit = rb_define_module("Memkit");
    VALUE cCore = rb_define_class_under(cPool, "NativeCore", cPool);

    eError = rb_const_get(mMemkit, rb_intern("Error"));
    eExhausted = rb_const_get(cPool, rb_intern("Exhausted"));
    eInvalidArgument = rb_const_get(mMemkit, rb_intern("InvalidArgument"));
    eFiberError = rb_path2class("FiberError");
    cQueue = rb_path2class("Thread::Queue");
    cFiber = rb_path2class("Fiber");
    /* Held in C statics: pinned, so GC.compact (Memkit.warmup) cannot move them. */
    rb_gc_register_mark_object(eError);
    rb_gc_register_mark_object(eExhausted);
    rb_gc_register_mark_object(eInvalidArgument);
    rb_gc_register_mark_object(eFiberError);
    rb_gc_register_mark_object(cQueue);
    rb_gc_register_mark_object(cFiber);
    storage_p = RTEST(rb_const_get(cPool, rb_intern("STORAGE")));
    id_new = rb_intern("new");
    id_keys = rb_intern("keys");
    id_storage = rb_intern("storage");
    id_aset = rb_intern("[]=");
    id_push = rb_intern("push");
    id_pop = rb_intern("pop");
    id_raise = rb_intern("raise");
    id_blocking_p = rb_intern("blocking?");

    rb_define_alloc_func(cCore, pool_alloc);
    rb_define_method(cCore, "run", pool_run, -1);
    rb_define_method(cCore, "size", pool_size, 0);
    rb_define_method(cCore, "idle", pool_idle, 0);
    rb_define_method(cCore, "after_fork", pool_after_fork, 0);
    rb_define_private_method(cCore, "setup", pool_setup, 2);
    return cCore;
}

void memkit_init_fiber_pool(VALUE mNative)
{
    rb_define_module_function(mNative, "define_fiber_pool_core", define_fiber_pool_core, 1);
}
