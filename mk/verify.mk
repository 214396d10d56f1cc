# Model checking of the C core's protocol with spin (Verification/, see its README).
#
#   make verify          every run of Verification/core.pml must be exhaustive, error-free
#   make verify-broken   every deliberately broken variant must fail with a trail
#   make verify-deferred-order
#                        shows (with a trail) that the deferred bodies of .immediate
#                        observers need not run in registration order (README: findings)
#   make verify-claim-window
#                        shows (with a trail) a cancel's reason split in a claim's window
#                        (README: findings)
#
# Runs go $(VERIFY_JOBS) at a time (make -j with --output-sync: each run's report stays
# in one piece). Outputs (pan.c, pan, trails) go to $(VERIFY_DIR), never into the tree.

SPIN          ?= spin
VERIFY_DIR    ?= $(BUILD_DIR)/verify
VERIFY_JOBS   ?= 2
VERIFY_MODEL  := Verification/core.pml
VERIFY_RUN    := SPIN='$(SPIN)' CC='$(CC)' bash Verification/run-pan.sh
# Memory bound of one pan run, in MiB (the largest run needs about 2.4 GiB; two at once
# stay far below a 24 GiB machine).
VERIFY_MEMLIM ?= 8192
# -w: pan.c is generated code; its warnings are not ours. The compile, not the search,
# is most of a run's time: -O2 takes about 15 s for the largest pan.c and searches no
# faster than -O1 (about 6 s). A broken variant stops at its first counterexample within
# seconds, so it is not worth optimising at all (-O0, under 2 s).
PAN_CC        := -O1 -w -DMEMLIM=$(VERIFY_MEMLIM)
PAN_SAFETY    := $(PAN_CC) -DSAFETY -DNOCLAIM
PAN_LIVENESS  := $(PAN_CC)
PAN_BROKEN    := -O0 -w -DMEMLIM=$(VERIFY_MEMLIM) -DSAFETY -DNOCLAIM -DREACH

.PHONY: verify verify-broken verify-deferred-order verify-claim-window verify-deps

verify-deps:
	@echo "==> verify-deps: looking for spin and a C compiler"
	@SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	missing=; \
	command -v $(SPIN) >/dev/null 2>&1 || missing="spin"; \
	command -v $(CC) >/dev/null 2>&1 || missing="$$missing gcc"; \
	if [ -z "$$missing" ]; then \
		echo "    found: $$(command -v $(SPIN)), $$(command -v $(CC))"; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "    missing:$$missing: installing with apt-get"; \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$missing; \
	elif command -v brew >/dev/null 2>&1 && [ "$$missing" = spin ]; then \
		echo "    missing: spin: installing with Homebrew"; \
		brew install spin; \
	else \
		echo "    missing:$$missing, and no apt-get here: install it by hand" >&2; exit 1; \
	fi

# $(call verify_run,NAME,pass|fail,SPIN_DEFINES,PAN_CFLAGS,PAN_FLAGS): one pan run,
# target verify-run-NAME, listed in VERIFY_pass_RUNS or VERIFY_fail_RUNS.
define verify_run
.PHONY: verify-run-$(1)
verify-run-$(1):
	@$$(VERIFY_RUN) $(2) $(1) $$(VERIFY_DIR) $$(VERIFY_MODEL) '$(3)' '$(4)' '$(5)'
VERIFY_$(2)_RUNS += verify-run-$(1)
endef

# The observer protocol: 3 registrars (4 nodes + 1 registered from a fire callback),
# 4 settlers (fulfil, reject, cancel, follow). The longest run first.
$(eval $(call verify_run,observers-liveness,pass,,$(PAN_LIVENESS),-a -m100000 -w26))
$(eval $(call verify_run,observers-safety,pass,,$(PAN_SAFETY),-m100000 -w26))
# The cancellation registry: 1 canceller against 3 children; against 2 children that
# also prune; 2 cancellers against 2 children.
$(eval $(call verify_run,registry-dekker-safety,pass,-DREGISTRY -DNCHILD=3,$(PAN_SAFETY),-m100000 -w24))
$(eval $(call verify_run,registry-dekker-liveness,pass,-DREGISTRY -DNCHILD=3,$(PAN_LIVENESS),-a -m100000 -w24))
$(eval $(call verify_run,registry-prune-safety,pass,-DREGISTRY -DNCHILD=2 -DNPRUNE=2,$(PAN_SAFETY),-m100000 -w24))
$(eval $(call verify_run,registry-prune-liveness,pass,-DREGISTRY -DNCHILD=2 -DNPRUNE=2,$(PAN_LIVENESS),-a -m100000 -w24))
$(eval $(call verify_run,registry-2cancellers-safety,pass,-DREGISTRY -DNCHILD=2 -DNCANCEL=2,$(PAN_SAFETY),-m100000 -w24))
$(eval $(call verify_run,registry-2cancellers-liveness,pass,-DREGISTRY -DNCHILD=2 -DNCANCEL=2,$(PAN_LIVENESS),-a -m100000 -w24))
# A cancel of a settled ancestor against handlers running in no registry, and the
# forwarding epoch (R -> P -> C, cancels of R and of an unrelated promise; also of P).
$(eval $(call verify_run,epoch-safety,pass,-DEPOCH,$(PAN_SAFETY),-m100000))
$(eval $(call verify_run,epoch-cancel-parent-safety,pass,-DEPOCH -DCANCEL_P,$(PAN_SAFETY),-m100000))

# Promises locking in to follow each other at once: rings of 2 and 3, the cycle check.
$(eval $(call verify_run,cycle-ring2-safety,pass,-DCYCLE -DNRING=2,$(PAN_SAFETY),-m100000))
$(eval $(call verify_run,cycle-ring3-safety,pass,-DCYCLE -DNRING=3,$(PAN_SAFETY),-m100000))
# The cycle check's skips through a pending child, against that child locking in to close
# a ring: with the skip recorded before, or by the walkers themselves.
$(eval $(call verify_run,walk-safety,pass,-DWALK_MODEL,$(PAN_SAFETY),-m100000))
$(eval $(call verify_run,walk-pre-recorded-safety,pass,-DWALK_MODEL -DPRE_RECORDED,$(PAN_SAFETY),-m100000))
$(eval $(call verify_run,gate-safety,pass,-DGATE -DNCB=3,$(PAN_SAFETY),-m100000))
# Cancel reach: a root's cancel, a leaf going in flight below a step nobody holds, a side
# branch that linked the leaf early, the step's death.
$(eval $(call verify_run,reach-safety,pass,-DREACH_MODEL,$(PAN_SAFETY),-m100000))

# Pruning: observers that gave up leave a pending promise, against registrations and a
# publisher that meets the prune (and waits for the nodes to come back).
$(eval $(call verify_run,prune-safety,pass,-DPRUNE,$(PAN_SAFETY),-m100000))
# A cascade keeps the path its inline handlers look up through: a chain's step keeps its
# parent, a follower that settles inside a cascade keeps its holds.
$(eval $(call verify_run,cascade-safety,pass,-DCASCADE_MODEL,$(PAN_SAFETY),-m100000))

# The lifetime model's rules together: a cancel of R, A or B against a chain whose step B
# (inline or on a queue) may be settled early by its holder, a queued leaf, a follower, a
# root settled at the top or nested, deaths; every reference released once, after its
# last user.
$(eval $(call verify_run,lifetime-safety,pass,-DLIFETIME_MODEL,$(PAN_SAFETY),-m100000))

# A cascade frees a kept step's value early, against readers through `parent`.
$(eval $(call verify_run,retire-safety,pass,-DRETIRE_MODEL,$(PAN_SAFETY),-m100000))

# A hold parked for a context's work, against a cancel that takes it and work that may
# never run.
$(eval $(call verify_run,park-safety,pass,-DPARK_MODEL,$(PAN_SAFETY),-m100000))

# The holds words: two children going in flight under one parent while they settle.
$(eval $(call verify_run,holds-safety,pass,-DHOLDS,$(PAN_SAFETY),-m100000))

# Broken variants (-I: a shortened counterexample).
$(eval $(call verify_run,broken-plain-store,fail,-DBROKEN_PLAIN_STORE,$(PAN_BROKEN),-m100000 -w22 -I))
$(eval $(call verify_run,broken-ignore-firing,fail,-DBROKEN_IGNORE_FIRING,$(PAN_BROKEN),-m100000 -w22 -I))
$(eval $(call verify_run,broken-stale-retry,fail,-DBROKEN_STALE_RETRY,$(PAN_LIVENESS),-a -m100000 -w22))
$(eval $(call verify_run,broken-dekker,fail,-DREGISTRY -DNCHILD=3 -DBROKEN_DEKKER,$(PAN_BROKEN),-m100000 -w22 -I))
$(eval $(call verify_run,broken-loser-walks,fail,-DREGISTRY -DNCHILD=2 -DNCANCEL=2 -DBROKEN_LOSER_WALKS,$(PAN_BROKEN),-m100000 -w22 -I))
$(eval $(call verify_run,broken-epoch-late-begin,fail,-DEPOCH -DBROKEN_LATE_BEGIN,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-epoch-active-equal,fail,-DEPOCH -DBROKEN_ACTIVE_EQUAL,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-cycle-no-fence,fail,-DCYCLE -DNRING=2 -DBROKEN_NO_FENCE,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-cycle-check-first,fail,-DCYCLE -DNRING=2 -DBROKEN_CHECK_FIRST,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-walk-no-advance,fail,-DWALK_MODEL -DPRE_RECORDED -DBROKEN_NO_ADVANCE,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-walk-epoch-first,fail,-DWALK_MODEL -DPRE_RECORDED -DBROKEN_EPOCH_FIRST,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-walk-look-first,fail,-DWALK_MODEL -DBROKEN_LOOK_FIRST,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-reach-hold-if-unlinked,fail,-DREACH_MODEL -DBROKEN_HOLD_IF_UNLINKED,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-gate-ignores-inside,fail,-DGATE -DNCB=3 -DBROKEN_GATE_IGNORES_INSIDE,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-epoch-parent-only,fail,-DEPOCH -DBROKEN_PARENT_ONLY,$(PAN_BROKEN),-m100000 -I))

$(eval $(call verify_run,broken-prune-on-top,fail,-DPRUNE -DBROKEN_PRUNE_ON_TOP,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-prune-no-wait,fail,-DPRUNE -DBROKEN_PRUNE_NO_WAIT,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-cascade-chain-drops-parent,fail,-DCASCADE_MODEL -DBROKEN_CHAIN_DROPS_PARENT,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-cascade-follower-drops-path,fail,-DCASCADE_MODEL -DBROKEN_FOLLOWER_DROPS_PATH,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-prune-plain-put-back,fail,-DPRUNE -DBROKEN_PRUNE_PLAIN_PUT_BACK,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-no-reapply,fail,-DLIFETIME_MODEL -DBROKEN_NO_REAPPLY,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-follow-skips-flight,fail,-DLIFETIME_MODEL -DBROKEN_FOLLOW_SKIPS_FLIGHT,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-no-followee-cancel,fail,-DLIFETIME_MODEL -DBROKEN_NO_FOLLOWEE_CANCEL,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-no-path-hold,fail,-DLIFETIME_MODEL -DBROKEN_NO_PATH_HOLD,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-self-kept,fail,-DLIFETIME_MODEL -DBROKEN_SELF_KEPT,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-settle-drops-parent,fail,-DLIFETIME_MODEL -DBROKEN_SETTLE_DROPS_PARENT,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-keep-after-claim,fail,-DLIFETIME_MODEL -DBROKEN_KEEP_AFTER_CLAIM,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-root-not-kept,fail,-DLIFETIME_MODEL -DBROKEN_ROOT_NOT_KEPT,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-link-stops-at-linked,fail,-DLIFETIME_MODEL -DBROKEN_LINK_STOPS_AT_LINKED,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-in-flight-keeps-nothing,fail,-DLIFETIME_MODEL -DBROKEN_IN_FLIGHT_KEEPS_NOTHING,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-early-child-unlinked,fail,-DLIFETIME_MODEL -DBROKEN_EARLY_CHILD_UNLINKED,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-retire-no-recheck,fail,-DRETIRE_MODEL -DBROKEN_RETIRE_NO_RECHECK,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-retire-separate-reads,fail,-DRETIRE_MODEL -DBROKEN_RETIRE_SEPARATE_READS,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-retire-flag-not-final,fail,-DRETIRE_MODEL -DBROKEN_RETIRE_FLAG_NOT_FINAL,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-retire-counts-a-passing-hold,fail,-DRETIRE_MODEL -DBROKEN_RETIRE_COUNTS_A_PASSING_HOLD,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-retire-counts-a-passing-link,fail,-DRETIRE_MODEL -DBROKEN_RETIRE_COUNTS_A_PASSING_LINK,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-park-no-recheck,fail,-DPARK_MODEL -DBROKEN_PARK_NO_RECHECK,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-park-no-fence,fail,-DPARK_MODEL -DBROKEN_PARK_NO_FENCE,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-lifetime-carrier-skips-registry,fail,-DLIFETIME_MODEL -DBROKEN_CARRIER_SKIPS_REGISTRY,$(PAN_BROKEN),-m100000 -I))

verify: verify-deps
	@echo "==> verify: spin, exhaustive, sequential consistency (see Verification/README.md)"
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j$(VERIFY_JOBS) --output-sync=target $(VERIFY_pass_RUNS) && \
	echo "==> verify: $(words $(VERIFY_pass_RUNS)) runs, all exhaustive, errors: 0 ($$(( $$(date +%s) - start )) s)"

verify-broken: verify-deps
	@echo "==> verify-broken: each broken variant must fail with a counterexample"
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j$(VERIFY_JOBS) --output-sync=target $(VERIFY_fail_RUNS) && \
	echo "==> verify-broken: $(words $(VERIFY_fail_RUNS)) broken variants, all caught ($$(( $$(date +%s) - start )) s)"

verify-deferred-order: verify-deps
	@$(VERIFY_RUN) fail deferred-order $(VERIFY_DIR) $(VERIFY_MODEL) \
		'-DDEFERRED_ORDER' '$(PAN_BROKEN)' '-m100000 -w22 -I'

# A finding (see Verification/README.md): a cancel that forwards through a handler's child
# between its claim and its publish, while the claim turns into an ancestor's cancel, hands
# its own reason to some descendants.
verify-claim-window: verify-deps
	@$(VERIFY_RUN) fail claim-window $(VERIFY_DIR) $(VERIFY_MODEL) \
		'-DREGISTRY -DCLAIM_WINDOW -DNCHILD=2 -DNCANCEL=2' '$(PAN_BROKEN)' '-m100000 -w22 -I'
$(eval $(call verify_run,broken-holds-bottom-up,fail,-DHOLDS -DBROKEN_BOTTOM_UP,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-holds-no-state-check,fail,-DHOLDS -DBROKEN_NO_STATE_CHECK,$(PAN_BROKEN),-m100000 -I))
$(eval $(call verify_run,broken-holds-self-test-then-clear,fail,-DHOLDS -DBROKEN_SELF_TEST_THEN_CLEAR,$(PAN_BROKEN),-m100000 -I))
