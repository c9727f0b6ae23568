/*
 * memkit's optional C extension: one shared object, one file per concept.
 * Loading it defines Memkit::Native and touches no other class, so the Ruby
 * files can load it in any order; each one installs or calls its own part
 * (lib/memkit/native.rb).
 */
#include <ruby.h>

void memkit_init_fiber_pool(VALUE mNative);

void Init_memkit_native(void)
{
    VALUE mNative = rb_define_module_under(rb_define_module("Memkit"), "Native");

    memkit_init_fiber_pool(mNative);
}
