// Must not compile: on a Promise<Void>, a `recover` body of several statements that
// returns nothing fits the value form and the promise form alike (the rules: write
// `error -> Void in`).
import Promise

@Sendable func log(_ error: any Error) { print(error) }
@Sendable func retryLater() {}

let saved = Promise<Void>()
saved.recover { error in
    log(error)
    retryLater()
}
