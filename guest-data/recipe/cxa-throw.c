/* The guest's libc++ and libc++abi are built without exception support and export no
 * __cxa_throw. C++ code that throws (numpy's pocketfft on invalid input, its unique_hash on a
 * failed string load) links against these instead: a throw ends the guest with a trap,
 * which ends the run, never the host. Hidden, so each module keeps its own copy. */
#include <stdio.h>
#include <stdlib.h>
#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN void *__cxa_allocate_exception(size_t size) {
    void *p = malloc(size);
    if (!p) abort();
    return p;
}
HIDDEN void __cxa_free_exception(void *p) { free(p); }
HIDDEN _Noreturn void __cxa_throw(void *obj, void *type, void (*destroy)(void *)) {
    (void)obj; (void)type; (void)destroy;
    fputs("fatal: C++ exception thrown in a wasm guest without exception support\n", stderr);
    fflush(stderr);
    abort();
}
