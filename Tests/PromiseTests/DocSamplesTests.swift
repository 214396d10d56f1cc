// Every code sample of README.md and the DocC articles (Sources/Promise/Promise.docc),
// pasted as written inside a function so that the build checks it compiles (an
// expression whose value a sample leaves unused is given to `_ =`). The only
// additions are the declarations a sample assumes (`fetch`, `User`, `imageView`, ...),
// given in each namespace below; `UIImage` is a stand-in (Linux has no UIKit). Samples
// that state an outcome are also run, in DocSamplesRunTests at the end.
import Dispatch
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Promise
import XCTest

// MARK: Stand-ins the samples assume

struct UIImage: Sendable { init?(data: Data) { if data.isEmpty { return nil } } }
@MainActor final class ImageView { var image: UIImage? }
@MainActor final class Label { var text: String? }
final class Spinner: Sendable { let stops = Counter(); func stop() { stops.increment() } }
final class Cancellable: Sendable { let cancels = Counter(); func cancel() { cancels.increment() } }
final class Logger: Sendable { let lines = Recorder<String>(); func warning(_ s: String) { lines.append(s) } }

// MARK: README.md, "A tour"

enum ReadmeTour {
    struct User: Sendable { var avatarURL: URL; var id: Int; var name: String }
    struct Settings: Sendable {}
    struct Profile: Sendable {}
    struct Page: Sendable { var text = "" }
    struct Config: Sendable {}
    struct Order: Sendable {}
    struct Transient: Error {}
    struct API: Sendable { func profile() async throws -> Profile { Profile() } }
    struct Mirror: Sendable { func fetch(_ path: String) -> Promise<Page> { Promise(value: Page(text: path)) } }

    static func download(_ url: URL) -> Promise<Data> { Promise(value: Data([1, 2, 3])) }
    static let placeholderData = Data([0])
    @MainActor static let imageView = ImageView()
    static let request = Cancellable()
    static let alice = User(avatarURL: URL(string: "https://example.com/a.png")!, id: 7, name: "alice")
    static func log(_ s: String) {}
    static let spinner = Spinner()
    static let api = API()
    static func fetch(_ url: URL) -> Promise<Page> { Promise(value: Page(text: url.absoluteString)) }
    static let a = URL(string: "https://example.com/a")!
    static let b = URL(string: "https://example.com/b")!
    static let url = a
    static let urls = [a, b]
    static let settings = Promise(value: Settings())
    static let mirrors = [Mirror(), Mirror()]
    static let path = "/index.html"
    static let primary = Promise(value: Page(text: "primary"))
    static let replica = Promise<Page>()
    static let files = ["a.txt", "b.txt"]
    static func upload(_ file: String) -> Promise<Void> { Promise(value: ()) }
    static func fetchConfig() -> Promise<Config> { Promise(value: Config()) }
    static func legacyLoad(completion: @escaping @Sendable (Result<Data, any Error>) -> Void) { completion(.success(Data())) }
    static let logger = Logger()
    static func fetchUser(_ id: Int) -> Promise<User> { Promise(value: alice) }
    static let deadline = ContinuousClock.now + .seconds(5)
    static func order() -> Promise<Order> { Promise(value: Order()) }
    static let reply = Promise<Page>()
    static let testClock = ManualClock()

    // Every line of the tour, as written (it awaits, so it runs in async code).
    static func tour() async throws {
        let user = Promise<User>()                          // pending; settle it once, from anywhere
        let avatar = user
            .then { $0.avatarURL }                          // map: (User) throws -> URL
            .then { url in download(url) }                  // flatMap: returns Promise<Data>; followed
            .validate { !$0.isEmpty }                       // false rejects with .validationFailure
            .recover { _ in placeholderData }               // an error handler's value fulfils
        avatar.then(on: .main) { data in MainActor.assumeIsolated { imageView.image = UIImage(data: data) } }

        let task = user.then(on: .immediate) { $0.id }      // inline on the settling thread
        task.cancel()                                       // settles as .cancelled; flows down
        _ = task.parent === user                                // navigation; task.root walks to the top
        user.onCancel { request.cancel() }                  // resolver side: stop the real work

        user.fulfill(alice)                                 // -> true; later resolvers get false
        avatar.catch { log("failed: \($0)") }               // side effect, passes the outcome on
        avatar.always { spinner.stop() }                    // either outcome

        let id = try await user.then { $0.id }.value        // async; a cancelled waiter throws, the
                                                            // promise untouched (sync: .wait(timeout:))
        let profile = Promise<Profile> { try await api.profile() }   // backed by a Task;
        profile.cancel()                                             // cancelling cancels the Task

        _ = Promise.all([fetch(a), fetch(b)])                   // -> Promise<[Page]>, input order
        _ = user.and(settings, avatar)                          // -> Promise<(User, Settings, Data)>
        _ = Promise.any(mirrors.map { $0.fetch(path) })         // first fulfilment
        _ = Promise.race([primary, replica])                    // first to settle
        _ = Promise.sequence(files) { upload($0) }              // one after another
        _ = Promise.retry(attempts: 3, delay: .milliseconds(10)) { fetchConfig() }
        _ = fetch(url).timeout(.seconds(2))                     // child rejects with .timedOut
        _ = Promise.wrap { done in legacyLoad(completion: done) }

        // For servers (DocC: "For servers")
        PromiseDiagnostics.setHandler { logger.warning("\($0)") }  // broken, unhandled, cycles
        _ = fetchUser(id).timeout(until: deadline)              // one deadline for every step
        _ = Promise.all(urls, maxConcurrent: 8) { fetch($0) }   // at most 8 in flight, input order
        _ = Promise.retry(attempts: 5, backoff: .exponential(initial: .milliseconds(50),
                      maximum: .seconds(2), jitter: 1), shouldRetry: { $0 is Transient }) { order() }
        _ = reply.timeout(.seconds(30), clock: testClock)       // tests advance a clock, never sleep

        print(task)                                         // Promise<Int>(cancelled: CancellationError())
        debugPrint(user)                                    // + address, where made (debug builds),
                                                            // observers waiting?, parent or root
        PromiseDiagnostics.setHandler(nil)                  // (added: leave no handler behind)
    }
}

// MARK: Promise.docc/Promise.md

enum PromiseArticle {
    struct User: Sendable { var displayName: String; var avatarURL: URL; var id: Int; var name: String }
    struct Settings: Sendable {}
    struct Page: Sendable {}
    static func lookUp(_ name: String) -> Promise<User> { Promise(value: alice) }
    @MainActor static let label = Label()
    static func download(_ url: URL) -> Promise<Data> { Promise(value: Data()) }
    static func log(_ s: String) {}
    static let spinner = Spinner()
    static let alice = User(displayName: "Alice", avatarURL: URL(string: "https://e.com")!, id: 1, name: "alice")
    static func fetch(_ url: URL) -> Promise<Page> { Promise(value: Page()) }
    static let a = URL(string: "https://e.com/a")!
    static let b = a
    static let url = a
    static let settings = Promise(value: Settings())
    static let primary = Promise(value: Page())
    static let replica = Promise<Page>()
    static func legacyLoad(completion: @escaping @Sendable (Result<Data, any Error>) -> Void) { completion(.success(Data())) }

    static func overview() {
        let greeting = lookUp("alice")
            .then { user in user.displayName }                 // map: (User) throws -> String
            .validate { !$0.isEmpty }                          // false rejects the child
            .recover { _ in "stranger" }                       // an error handler's value fulfils
        greeting.then(on: .main) { name in MainActor.assumeIsolated { label.text = "Hello, \(name)" } }
    }

    static func tour() async throws {
        let user = Promise<User>()                           // pending

        let avatar = user
            .then { $0.avatarURL }                           // map
            .then { url in download(url) }                   // flatMap: the child follows it
            .catch { log("failed: \($0)") }                  // side effect, passes the outcome on
            .always { spinner.stop() }                       // either outcome

        let task = user.then(on: .immediate) { $0.id }       // inline on the settling thread
        task.cancel()                                        // task and what hangs below it; never user
        _ = task.parent === user                                 // navigation, as in RXPromise

        user.fulfill(alice)                                  // true; a second call returns false

        let id = try await user.then { $0.id }.value         // async code
        // synchronous code blocks instead: try user.then { $0.id }.wait(timeout: .seconds(1))
        _ = id

        _ = Promise.all([fetch(a), fetch(b)])                    // Promise<[Page]>, input order
        _ = user.and(settings, avatar)                           // Promise<(User, Settings, Data)>
        _ = Promise.race([primary, replica])                     // first to settle
        _ = fetch(url).timeout(.seconds(2))                      // child rejects with .timedOut
        _ = Promise.wrap { done in legacyLoad(completion: done) } // completion handlers
    }
}

// MARK: Promise.docc/Cancellation.md

enum CancellationArticle {
    struct User: Sendable { var avatar = "a.png"; var name = "alice" }
    struct Page: Sendable { static let empty = Page(); var title = "" }
    struct Input: Sendable {}
    struct Thumbnail: Sendable {}
    static let alice = User()
    static let cached = Page(title: "cached")
    static let lookups = Recorder<String>()
    static func lookup(_ name: String) -> Promise<User> { lookups.append(name); return Promise() }
    static func profilePage(for user: User) -> Page { Page(title: user.name) }
    static func expensive(_ x: Int) -> Int { x * 2 }
    static func makeThumbnail(_ data: Data) throws -> Thumbnail { Thumbnail() }
    static let session = URLSession(configuration: .ephemeral)
    static let url = URL(string: "http://127.0.0.1:9/")!
    static let cleanUps = Counter()
    static func cleanUpTemporaryFiles() { cleanUps.increment() }
    static func fetch(_ url: URL) -> Promise<Page> { Promise() }
    static func parse(_ input: Input) -> String { "parsed" }
    static let fetched = Recorder<Promise<Page>>()
    static func fetch(_ s: String) -> Promise<Page> { let p = Promise<Page>(); fetched.append(p); return p }
    static func download() -> Promise<Data> { Promise(value: Data()) }
    static func summarize(_ data: Data) -> String { "\(data.count) bytes" }
    final class Cache: Sendable { func get(_ key: String, _ callback: @escaping @Sendable (User) -> Void) {} }
    static let cache = Cache()
    static let key = "alice"

    static func neverUpNeverSideways() {
        let shared = lookup("alice")                       // one request, two consumers
        let forSidebar = shared.then { $0.avatar }
        let forHeader = shared.then { $0.name }

        forSidebar.cancel()       // forSidebar: .cancelled
                                  // shared: untouched, still pending (never up)
                                  // forHeader: untouched, gets its value (never sideways)
        _ = forHeader
    }

    static func insideImmediate(trigger: Promise<Int>, request: Promise<Page>, reply: Promise<Page>) {
        trigger.whenComplete(on: .immediate) { _ in
            request.cancel()
            _ = reply.fulfill(cached)   // false: `reply`, a child of `request`, takes the cancel
        }
    }

    static func settledThenCancelled() -> (Promise<User>, Promise<Page>) {
        let user = Promise<User>(value: alice)              // already fulfilled
        let page = user.then { profilePage(for: $0) }       // queued on .default
        user.cancel()                                       // user stays fulfilled; unless
                                                            // the handler has already run
                                                            // (the queue may be that quick),
                                                            // page ends cancelled; a handler
                                                            // not started never runs
        return (user, page)
    }

    static func runningHandler() -> (Promise<Int>, Promise<Int>) {
        let root = Promise<Int>()
        let step = root.then(on: .immediate) { expensive($0) }  // runs on the fulfilling thread
        return (root, step)
    }

    static func download(_ url: URL) -> Promise<Data> {
        let promise = Promise<Data>()
        let task = session.dataTask(with: url) { data, _, error in
            if let data { promise.fulfill(data) } else { promise.reject(error ?? URLError(.unknown)) }
        }
        promise.onCancel { task.cancel() }     // cancelling the promise, or any ancestor of it,
        task.resume()                          // stops the download
        return promise
    }

    static func onCancelPattern() -> Promise<Thumbnail> {
        let thumbnail = download(url).then { try makeThumbnail($0) }
        thumbnail.root.cancel()                    // the whole tree: the data task is cancelled
        return thumbnail
    }

    static func recoverOnCancel() -> Promise<Page> {
        let request = fetch(url)
        let report = request.recover { error in      // runs for the cancel too
            cleanUpTemporaryFiles()
            return .empty                            // ignored: report stays cancelled
        }
        request.cancel()
        return report
    }

    static func raceLosers(primary: Promise<Page>, fallback: Promise<Page>) -> Promise<Page> {
        let winner = Promise.race([primary, fallback])
        winner.whenComplete(on: .immediate) { _ in primary.cancel(); fallback.cancel() }
        return winner
    }

    static func memory() -> Promise<String> {
        let summary = download().then { summarize($0) }
        // once summary settled: the downloaded value is freed, summary.parent is nil
        return summary
    }

    static func reachesTheFetch(input: Input) -> Promise<Page> {
        let request = Promise<Input>()
        let reply = request.map(on: .immediate) { parse($0) }     // nobody holds this step
                           .flatMap(on: .immediate) { fetch($0) }  // follows the fetch
        request.fulfill(input)
        request.cancel()   // reaches `reply` through the parse step, and cancels the fetch
        return reply
    }

    static func lookup() -> Promise<User> {
        let promise = Promise<User>()
        cache.get(key) { user in promise.fulfill(user) }   // if `get` drops its callback...
        return promise
    }

    static func broken() -> Promise<String> {
        let name = lookup().then { $0.name }
        // ...the promise is freed pending, and `name` rejects with PromiseError.brokenPromise
        return name
    }
}

// MARK: Promise.docc/ExecutionContexts.md

enum ContextsArticle {
    struct Page: Sendable { var title = "t" }
    struct Model: Sendable {}
    final class Cache: Sendable {
        let queue = DispatchQueue(label: "cache")
        func store(_ m: Model) -> Model { m }
    }
    @MainActor final class View { var shown = 0; func show(_ m: Model) { shown += 1 } }
    static let cache = Cache()
    @MainActor static let view = View()
    static func fetch(_ url: URL) -> Promise<Data> { Promise(value: Data()) }
    static func decode(_ data: Data) throws -> Model { Model() }
    static let url = URL(string: "https://e.com")!
    static let body = Promise(value: "body")
    static let printed = Recorder<String>()
    static func print(_ s: String) { printed.append(s) }

    static func chooseAContext() {
        fetch(url)                                        // settles on a networking thread
            .then { data in try decode(data) }            // .default: a private concurrent queue
            .then(on: cache.queue) { cache.store($0) }    // a DispatchQueue you own
            .then(on: .main) { value in                   // the main queue
                MainActor.assumeIsolated { view.show(value) }
            }
    }

    static func noZalgo() -> DispatchQueue {
        let queue = DispatchQueue(label: "state")              // serial
        queue.async {
            Promise(value: 1).then(on: queue) { _ in print("2: the handler") }
            print("1: after then")                             // always first
        }
        return queue
    }

    static func immediate() -> Promise<Int> {
        let length = body.then(on: .immediate) { $0.count }    // no hop, no queue
        return length
    }
}

// MARK: Promise.docc/ForServers.md

enum ServersArticle {
    struct User: Sendable {}
    struct Cart: Sendable {}
    struct Response: Sendable {}
    struct Request: Sendable { var userID = 1 }
    struct Order: Sendable {}
    struct Page: Sendable {}
    struct BackendError: Error { var isTransient: Bool }
    typealias TestClock = ManualClock        // "your manual clock": the tests' own
    static let logger = Logger()
    static func fetchUser(_ id: Int) -> Promise<User> { Promise(value: User()) }
    static func fetchCart(for user: User) -> Promise<Cart> { Promise(value: Cart()) }
    static func render(_ cart: Cart) -> Response { Response() }
    static let cart = Cart()
    static let attempts = Counter()
    static func placeOrder(_ cart: Cart) -> Promise<Order> {
        attempts.increment() < 3 ? Promise(error: BackendError(isTransient: true)) : Promise(value: Order())
    }
    static let urls = [URL(string: "https://e.com/1")!, URL(string: "https://e.com/2")!]
    static func fetch(_ url: URL) -> Promise<Page> { Promise(value: Page()) }

    static func diagnostics() {
        PromiseDiagnostics.setHandler { event in
            logger.warning("\(event)")
        }
    }

    static func handle(_ request: Request) -> Promise<Response> {
        let deadline = ContinuousClock.now + .seconds(2)
        return fetchUser(request.userID)
            .timeout(until: deadline)
            .then { user in fetchCart(for: user).timeout(until: deadline) }
            .then { cart in render(cart) }
    }

    static func testClock(request: Promise<Int>) -> Promise<Int> {
        let clock = TestClock()                          // your manual clock: advance(by:) wakes sleepers
        let reply = request.timeout(.seconds(30), clock: clock)
        clock.advance(by: .seconds(30))
        // reply rejects with PromiseError.timedOut, and the test never slept
        return reply
    }

    static func retries() -> Promise<Order> {
        let order = Promise.retry(
            attempts: 5,
            backoff: .exponential(initial: .milliseconds(50), maximum: .seconds(2), jitter: 1),
            shouldRetry: { ($0 as? BackendError)?.isTransient ?? false }
        ) { placeOrder(cart) }
        return order
    }

    static func fanOut() -> Promise<[Page]> {
        let pages = Promise.all(urls, maxConcurrent: 8) { url in fetch(url) }   // Promise<[Page]>
        return pages
    }
}

// MARK: Promise.docc/Extensions/*.md (one function per page, in file-name order)

enum SymbolPages {
    struct User: Sendable { var name = "n" }
    struct Page: Sendable { var title = "t" }
    struct Config: Sendable, Decodable { static let defaults = Config() }
    struct Image: Sendable {}
    final class Index: Sendable { func insert(_ s: String) {}; func contains(_ s: String) -> Bool { true } }
    final class ReadCache: Sendable { func peek(_ s: String) -> String { s } }
    final class Model: Sendable { func update(with p: Page) {} }
    static let download = Promise<Int>()
    static func showSpinner() {}
    static func hideSpinner() {}
    static func showRetryButton() {}
    static let readers = DispatchQueue(label: "readers", attributes: .concurrent)
    static let cache = ReadCache()
    static let index = Index()
    static let queue = DispatchQueue(label: "q", attributes: .concurrent)
    static func lookup(_ key: String) -> Promise<String> { Promise(value: key) }
    static let key = "k"
    static let query = Promise(value: "q")
    static func readOnlyWork() {}
    static func fetch(_ url: URL) -> Promise<Data> { Promise(value: Data()) }
    static func fetchPage(_ url: URL) -> Promise<Page> { Promise(value: Page()) }
    static func decode(_ d: Data) throws -> Page { Page() }
    static let url = URL(string: "https://e.com")!
    static func sha256(of file: String) throws -> String { "hash" }
    static let file = "f"
    @MainActor static let imageView = ImageView()
    @MainActor static let label = Label()
    static let model = Model()
    static let body = Promise(value: "abc")
    static func save(_ d: Data) throws {}
    static let data = Data("{}".utf8)
    static let page = Page()
    static func render(_ p: Page) {}
    static func loadConfig() -> Promise<Config> { Promise(value: Config()) }
    static func legacyLoad(_ completion: @escaping @Sendable (Result<Data, any Error>) -> Void) {}
    static let mirrorA = url
    static let mirrorB = url
    static func showSlowNetworkHint() {}
    static func showInvalidResponse() {}
    static func log(_ x: Any) {}
    static func legacyFetchImage(named: String, completion: @escaping @Sendable (Image?, (any Error)?) -> Void) {}

    static func anyPromiseIsCancelled() {
        let p = Promise<Int>()
        p.cancel()
        _ = p.isCancelled    // true
        _ = p.isRejected     // false: cancelled is its own state
    }
    static func anyPromiseIsFulfilled() {
        let p = Promise(value: 1)
        _ = p.isFulfilled    // true
    }
    static func anyPromiseIsPending() {
        let p = Promise<Int>()
        _ = p.isPending      // true
        p.fulfill(1)
        _ = p.isPending      // false
    }
    static func anyPromiseIsRejected() {
        let p = Promise<Int>(error: CancellationError())
        _ = p.isRejected     // true: rejected with an error, even this one
    }
    static func anyPromiseParent() {
        let user = Promise<User>()
        let name = user.then { $0.name }
        _ = name.parent === user          // true
        _ = user.parent == nil            // true: a root
    }
    static func anyPromiseState() {
        switch download.state {
        case .pending: showSpinner()
        case .fulfilled: hideSpinner()
        case .rejected, .cancelled: showRetryButton()
        }
    }
    static func concurrentQueueContextConcurrent() {
        lookup(key).then(on: .concurrent(readers)) { cache.peek($0) }
    }
    static func concurrentQueueContextExecute() {
        ConcurrentQueueContext.concurrent(queue).execute { readOnlyWork() }   // queue.async
    }
    static func concurrentQueueContext() {
        let queue = DispatchQueue(label: "index", attributes: .concurrent)
        query.then(on: queue) { index.insert($0) }                 // barrier: alone on the queue
        query.then(on: .concurrent(queue)) { index.contains($0) }  // plain async: may overlap
    }
    static func defaultExecutionContextDefault() {
        fetch(url).then(on: .default) { try decode($0) }
    }
    static func defaultExecutionContextExecute() {
        DefaultExecutionContext.default.execute { print("on the library's concurrent queue") }
    }
    static func defaultExecutionContext() {
        let checksum = Promise<String>(on: .default) { try sha256(of: file) }
        checksum.then { print($0) }                       // `on:` left out: also .default
    }
    static func dispatchQueueExecute() {
        queue.execute { print("a barrier block on queue") }    // what `then(on: queue)` does
    }
    static func dispatchQueueMain() {
        fetchPage(url).then(on: .main) { page in MainActor.assumeIsolated { label.text = page.title } }
    }
    static func dispatchQueue() {
        let state = DispatchQueue(label: "state")                  // serial: FIFO
        fetchPage(url).then(on: state) { model.update(with: $0) }
    }
    static func executionContextConcurrent() {
        let readers = DispatchQueue(label: "cache", attributes: .concurrent)
        lookup(key).then(on: .concurrent(readers)) { cache.peek($0) }   // may overlap other readers
    }
    static func executionContextDefault() {
        fetch(url).then(on: .default) { try decode($0) }   // the same as leaving `on:` out
    }
    struct LoggingContext: ExecutionContext {
        let base: DispatchQueue
        func execute(_ work: @escaping @Sendable () -> Void) {
            base.async { print("running a handler"); work() }   // later, exactly once
        }
    }
    static func executionContextImmediate() {
        let length = body.then(on: .immediate) { $0.count }   // on the settling thread, no hop
        _ = length
    }
    static func executionContextMain() {
        fetch(url).then(on: .main) { data in
            MainActor.assumeIsolated { imageView.image = UIImage(data: data) }
        }
    }
    static func operationQueueExecute(_ operations: OperationQueue) {
        operations.execute { print("runs as a block operation") }
    }
    static func operationQueue() {
        let operations = OperationQueue()
        operations.maxConcurrentOperationCount = 1
        fetch(url).then(on: operations) { try save($0) }
    }
    static func immediateExecute() {
        ImmediateExecutionContext.immediate.execute { print("runs before execute returns") }
    }
    static func immediateImmediate() {
        let length = body.then(on: .immediate) { $0.count }
        _ = length
    }
    static func immediateChain() throws -> Int {
        let first = Promise<Int>()
        var last = first
        for _ in 0..<100_000 { last = last.then(on: .immediate) { $0 + 1 } }
        first.fulfill(0)            // the whole chain settles inside this call, in constant stack
        return try last.wait()             // 100000   (added: `return`, to check the value)
    }
    static func promiseFulfill() -> Promise<Int> {
        let answer = Promise<Int>()
        answer.fulfill(42)      // true
        answer.fulfill(43)      // false: a promise settles once; the value stays 42
        return answer
    }
    static func promiseInit() {
        let answer = Promise<Int>()      // pending
        _ = answer.isPending                 // true
        answer.fulfill(42)               // true: settled now
    }
    static func promiseInitError(text: String) -> Promise<Data> {
        guard let url = URL(string: text) else { return Promise<Data>(error: URLError(.badURL)) }
        return fetch(url)
    }
    static func promiseInitResult() {
        let parsed = Promise(result: Result { try JSONDecoder().decode(Config.self, from: data) })
        _ = parsed
    }
    static func promiseInitValue() {
        let cached = Promise(value: page)          // Promise<Page>, already fulfilled
        cached.then { render($0) }                 // still runs on .default, never inside `then`
    }
    struct NotFound: Error {}
    static func promiseReject() {
        let user = Promise<User>()
        user.reject(NotFound())    // true; the chain below skips to its error handlers
    }
    static func promiseResolve() {
        let promise = Promise<Data>()
        legacyLoad { (result: Result<Data, any Error>) in promise.resolve(result) }
    }
    static func promiseResolveWith() -> Promise<Config> {
        let current = Promise<Config>()
        current.resolve(with: loadConfig())   // settles as loadConfig()'s promise does
        current.fulfill(.defaults)            // false: locked in to follow
        return current
    }
    static func promiseErrorAllRejected() {
        Promise.any([fetch(mirrorA), fetch(mirrorB)]).catch { error in
            if case PromiseError.allRejected(let errors) = error { print(errors) }   // input order
        }
    }
    static func promiseErrorTimedOut() {
        do {
            _ = try Promise<Int>().wait(timeout: .milliseconds(50))
        } catch PromiseError.timedOut {
            print("nobody settled it in time")
        } catch {}   // (added: the sample's function does not throw)
    }
    static func promiseErrorValidationFailure() {
        Promise(value: -1).validate { $0 > 0 }
            .catch { print($0) }     // validation failed
    }
    static func promiseError() {
        fetch(url).timeout(.seconds(2)).catch { error in
            switch error {
            case PromiseError.timedOut: showSlowNetworkHint()
            case PromiseError.validationFailure: showInvalidResponse()
            case PromiseError.allRejected(let errors): log(errors)
            default: log(error)
            }
        }
    }
    static func promiseStateCancelled() {
        let p = Promise<Int>()
        p.cancel()
        _ = p.state == .cancelled     // true; p.isRejected stays false
    }
    static func promiseStateFulfilled() {
        _ = Promise(value: 1).state == .fulfilled     // true
    }
    static func promiseStatePending() {
        _ = Promise<Int>().state == .pending     // true
    }
    static func promiseStateRejected() {
        _ = Promise<Int>(error: URLError(.timedOut)).state == .rejected     // true
    }
    static func promiseState() {
        let p = Promise<Int>()
        _ = p.state == .pending     // true
        p.cancel()
        _ = p.state == .cancelled   // true
    }
    static func wrapNeither() {
        let p = Promise<Int>.wrap { done in done(nil, nil) }
        p.catch { print($0) }     // the wrapped completion handler was called with neither a value nor an error
    }
    static func wrapError() {
        let image = Promise<Image>.wrap { done in legacyFetchImage(named: "logo", completion: done) }
        image.catch { if case PromiseWrapError.neitherValueNorError = $0 { log("no image, no error") } }
    }
}

// MARK: Rules.md spellings

enum RulesSpellings {
    static func log(_ x: Int) {}
    static func notify() {}
    static func compute() -> Int { 42 }
    static func statementHandler(_ p: Promise<Int>) {
        p.then { log($0) }                      // a continuation as a statement: no warning
    }
    static func saidWhich(_ p: Promise<Int>) -> Promise<Void> {
        let done: Promise<Void> = p.then { value -> Void in log(value); notify() }
        return done
    }
    static func twoHandlers(_ p: Promise<Int>) -> Promise<Int> {
        let nested: Promise<Promise<Int>> = p.then({ Promise(value: $0) }, { _ in Promise(value: 0) })
        return nested.flatMap { $0 }
    }
    static func typed() -> Promise<Int> {
        Promise<Int> { compute() }
    }
}

// MARK: Running the samples that state an outcome

final class DocSamplesRunTests: XCTestCase {
    func testReadmeTourRuns() async throws {
        try await ReadmeTour.tour()
    }

    func testPromiseArticleTourRuns() async throws {
        try await PromiseArticle.tour()
    }

    func testImmediateChainSampleGives100000() throws {
        try runInChildProcess {
            XCTAssertEqual(try SymbolPages.immediateChain(), 100_000)
        }
    }

    func testFulfillSample() throws {
        XCTAssertEqual(try SymbolPages.promiseFulfill().wait(timeout: testTimeout), 42)
    }

    func testResolveWithSample() throws {
        let current = SymbolPages.promiseResolveWith()
        _ = try current.wait(timeout: testTimeout)
        XCTAssertTrue(current.isFulfilled)
    }

    func testNoZalgoSamplePrintsInOrder() {
        let queue = ContextsArticle.noZalgo()
        XCTAssertTrue(eventually { ContextsArticle.printed.count == 2 })
        queue.sync {}
        XCTAssertEqual(ContextsArticle.printed.values, ["1: after then", "2: the handler"])
    }

    /// ForServers.md, the test clock sample, run as written: no wait for the timer to be set first.
    func testServersTestClockSample() {
        let request = Promise<Int>()
        let reply = ServersArticle.testClock(request: request)
        let r = outcome(reply)
        XCTAssertTrue(isPromiseError(r, .timedOut), "got \(String(describing: r))")
        XCTAssertTrue(request.isPending)
    }

    func testServersHandleSample() throws {
        _ = try ServersArticle.handle(.init()).wait(timeout: testTimeout)
    }

    func testServersRetrySample() throws {
        _ = try ServersArticle.retries().wait(timeout: testTimeout)
        XCTAssertEqual(ServersArticle.attempts.value, 3)
    }

    func testCancellationSamples() throws {
        CancellationArticle.neverUpNeverSideways()

        let trigger = Promise<Int>()
        let request = Promise<CancellationArticle.Page>()
        let reply = request.then { $0 }
        let fulfilledResult = Recorder<Bool>()
        trigger.whenComplete(on: .immediate) { _ in
            request.cancel()
            fulfilledResult.append(reply.fulfill(CancellationArticle.cached))
        }
        trigger.fulfill(1)
        XCTAssertEqual(fulfilledResult.values, [false])
        XCTAssertTrue(reply.isCancelled)

        let (user, page) = CancellationArticle.settledThenCancelled()
        settle(page)
        XCTAssertTrue(user.isFulfilled)
        XCTAssertTrue(page.isCancelled || page.isFulfilled)

        let report = CancellationArticle.recoverOnCancel()
        settle(report)
        XCTAssertTrue(report.isCancelled)
        XCTAssertTrue(eventually { CancellationArticle.cleanUps.value == 1 })

        // onCancelPattern() is compiled, not run: cancelling a URLSessionDataTask traps
        // inside FoundationNetworking on Linux (TaskRegistry.swift:118), nothing of Promise's.

        let reply2 = CancellationArticle.reachesTheFetch(input: .init())
        XCTAssertTrue(reply2.isCancelled)
        XCTAssertEqual(CancellationArticle.fetched.values.map(\.isCancelled), [true])

        let name = CancellationArticle.broken()
        let e = error(name)
        XCTAssertTrue(e.map { if case PromiseError.brokenPromise = $0 { return true } else { return false } } ?? false,
                      "got \(String(describing: e))")

        let summary = CancellationArticle.memory()
        XCTAssertEqual(value(summary), "0 bytes")
        XCTAssertTrue(eventually { summary.parent == nil })
    }
}
