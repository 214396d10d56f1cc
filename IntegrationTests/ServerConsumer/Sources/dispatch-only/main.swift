// The same shape of work as server-consumer, on Dispatch and Swift concurrency alone:
// the binary size a server pays without Promise.
import Dispatch

let loop = DispatchQueue(label: "dispatch-only.loop")
let page: String = await withCheckedContinuation { done in
    loop.async { done.resume(returning: "ada's cart: 3 items") }
}
let prices = await withTaskGroup(of: Int.self) { group in
    for n in 1...3 { group.addTask { n * 10 } }
    var sum = 0
    for await price in group { sum += price }
    return sum
}
guard page == "ada's cart: 3 items", prices == 60 else { fatalError("dispatch-only: wrong answer") }
print("dispatch-only: ok")
