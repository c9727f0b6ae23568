/*
 * One call per request for Memkit::Soak::RackDriver's loop (#drive_native):
 * finish checking the previous response and copy the env for the next one.
 * lib/memkit/soak/rack_driver.rb is the reference and the fallback when this
 * is not compiled.
 *
 * Why C: the driver must check every body's class and both callback arrays.
 * In Ruby each check is a method call, ~280 x86 instructions on Ruby 3.1
 * (cachegrind), and with them the driver cost 1.17x a bare
 * `app.call(env.merge)` loop on a 1 us app. Here the checks are a few loads
 * inside the call that copies the env, which a bare loop makes too. The loop
 * itself stays in Ruby: calling the app from C (rb_funcallv) enters a new VM
 * loop per request, and that was slower than the checks it saved.
 */
#include <ruby.h>

/*
 * soak_next(template, response, finished, after): a fresh env (a copy of
 * template, like Hash#merge: no #initialize_copy, not frozen) if the previous
 * response was an ordinary one -- a triple with an Array body, and no
 * callback registered -- else false, and the Ruby driver finishes that
 * request itself.
 */
static VALUE soak_next(VALUE self, VALUE template, VALUE response, VALUE finished, VALUE after)
{
    VALUE body;

    Check_Type(template, T_HASH);
    if (!RB_TYPE_P(response, T_ARRAY) || RARRAY_LEN(response) != 3) return Qfalse;
    body = RARRAY_AREF(response, 2);
    /* Body#instance_of?(Array): a subclass may define #close or #each. */
    if (RB_SPECIAL_CONST_P(body) || rb_obj_class(body) != rb_cArray) return Qfalse;
    if (!RB_TYPE_P(finished, T_ARRAY) || !RB_TYPE_P(after, T_ARRAY)) return Qfalse;
    if (RARRAY_LEN(finished) || RARRAY_LEN(after)) return Qfalse;
    return rb_hash_dup(template);
}

void memkit_init_rack_driver(VALUE mNative)
{
    rb_define_module_function(mNative, "soak_next", soak_next, 4);
}
