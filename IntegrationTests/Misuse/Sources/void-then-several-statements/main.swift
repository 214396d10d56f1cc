// Must not compile: a handler of several statements that returns nothing, where the child
// must be a Promise<Void>, is read as the promise-returning `then` missing its `return`
// (the rules: write `-> Void`, or `map`).
import Promise

@Sendable func log(_ value: Int) { print(value) }
@Sendable func notify() {}

let done: Promise<Void> = Promise(value: 1).then { value in
    log(value)
    notify()
}
print(done)
