// The core's headers from C++: they promise `extern "C"` declarations that compile in
// either language (an embedder's C++ code may include them). Compiled by `make test-core`
// with -pedantic-errors, which rejects a C-only keyword in them.
#include "CPromiseCore.h"

int main() {
    pc_promise promise{};
    pc_node node{};
    static_assert(alignof(pc_node) >= 8, "a node's low three address bits carry tags");
    (void)promise;
    (void)node;
    return 0;
}
