// What a request handler does with promises, in a binary that must link no Foundation.
import Dispatch
import Promise

struct Backend: Error, CustomStringConvertible {
    var description: String { "the backend answered 503" }
}

let loop = DispatchQueue(label: "server-consumer.loop")
let user = Promise<String>(), cart = Promise<Int>()
let page = user.then(on: loop) { "\($0)'s cart" }
    .and(cart)
    .then(on: .immediate) { "\($0.0): \($0.1) items" }
let prices = Promise.all((1...3).map { n in Promise(on: .default) { n * 10 } })
let flaky = Promise<Int>(error: Backend()).recover(on: .immediate) { _ in -1 }
let fastest = Promise.race([Promise<Int>(), Promise(value: 7)])
user.fulfill("ada")
cart.fulfill(3)

/// True if `promise` fulfils with `expected`; says what went wrong otherwise.
func check<T: Equatable & Sendable>(_ promise: Promise<T>, _ expected: T, _ what: String) async -> Bool {
    do {
        let value = try await promise.value
        if value == expected { return true }
        print("FAIL: \(what): \(value), expected \(expected)")
    } catch {
        print("FAIL: \(what): \(error)")
    }
    return false
}
var failures = 0
if await !check(page, "ada's cart: 3 items", "then + and") { failures += 1 }
if await !check(prices, [10, 20, 30], "all") { failures += 1 }
if await !check(flaky, -1, "recover") { failures += 1 }
if await !check(fastest, 7, "race") { failures += 1 }
// The errors describe themselves without LocalizedError.
let sentence = String(describing: PromiseError.timedOut)
if sentence != "the promise timed out before it was settled" { print("FAIL: \(sentence)"); failures += 1 }
if failures > 0 { fatalError("server-consumer: \(failures) failures") }
print("server-consumer: ok")
