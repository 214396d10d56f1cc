// Must not compile: a trailing closure that does not `await`, with the type left to
// inference, is read as the value of `init(value:)` (the rules: spell the type,
// `Promise<Int> { compute() }`).
import Promise

@Sendable func compute() -> Int { 42 }

let computed = Promise { compute() }
print(computed)
