/*
 * CPromiseCore: the lock-free C core of the Promise library, one header per subsystem:
 *
 *   pc_promise.h   the promise state machine: the state and claim words, registration,
 *                  settling, firing in order through a per-thread trampoline
 *   pc_registry.h  what cancellation needs after a promise settled: the registry of
 *                  descendants in flight, the tree flags, the holds, the forwarding epoch
 *   pc_overlay.h   helpers only the Swift overlay uses: countdown, election, fence,
 *                  waiter, locked words
 *
 * Every atomic operation in CPromiseCore.c says what its memory ordering publishes or
 * acquires.
 */
#ifndef CPROMISECORE_H
#define CPROMISECORE_H

#include "pc_promise.h"
#include "pc_registry.h"
#include "pc_overlay.h"

#endif /* CPROMISECORE_H */
