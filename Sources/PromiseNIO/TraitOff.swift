// What PromiseNIO holds when the package trait SwiftNIO is off: no SwiftNIO (nothing is
// fetched or built for it), and markers for its main names, so that code written for
// PromiseNIO fails with a message that says how to turn the trait on instead of
// "cannot find 'EventLoopContext' in scope".
#if !SwiftNIO
import Promise

/// PromiseNIO was built without SwiftNIO: enable the package trait.
@available(*, unavailable, message: "PromiseNIO is built without SwiftNIO: add traits: [\"SwiftNIO\"] to the Promise package dependency")
public struct EventLoopContext {}

extension Promise {
    /// PromiseNIO was built without SwiftNIO: enable the package trait.
    @available(*, unavailable, message: "PromiseNIO is built without SwiftNIO: add traits: [\"SwiftNIO\"] to the Promise package dependency")
    public func futureResult<Loop>(on eventLoop: Loop) -> Never { fatalError("unavailable") }

    /// PromiseNIO was built without SwiftNIO: enable the package trait.
    @available(*, unavailable, message: "PromiseNIO is built without SwiftNIO: add traits: [\"SwiftNIO\"] to the Promise package dependency")
    public func hop<Loop>(to eventLoop: Loop) -> Never { fatalError("unavailable") }
}
#endif
