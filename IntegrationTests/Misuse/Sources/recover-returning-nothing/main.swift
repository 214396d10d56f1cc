// Must not compile: a `recover` whose body returns nothing on a promise of a value (a log
// line meant as `catch`). Swift 6.3 reports it only as "failed to produce diagnostic"; the
// rules say so, and this check tells when a newer compiler says more.
import Promise

let count = Promise<Int>()
count.recover { error in print(error) }
