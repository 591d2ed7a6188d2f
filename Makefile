# FileCoordination: `make demo` runs the main job, `make test` the tests.
# Both install what they need on a fresh Debian machine with the Swift toolchain.
SWIFT ?= swift
SWIFTC ?= $(dir $(realpath $(shell command -v $(SWIFT))))swiftc
# pipefail: a failing build must not hide behind `| tee`.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
INOTIFY_HEADER := /usr/include/inotifytools/inotifytools.h
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps deps-etcd build test grdb-check test-tsan test-asan fuzz fuzz-merge watch-check soak simulate simulate-planted limits docs demo bench install man install-files static-archives clean

all: build

# libinotifytools ships no pkg-config file; the header is the test for the package.
deps:
	@if [ ! -f $(INOTIFY_HEADER) ]; then \
		echo "make: installing libinotifytools0-dev (inotify C library)"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libinotifytools0-dev; \
	fi

# etcd (Debian: etcd-server), for the etcd space's tests and benchmarks: each test
# starts its own servers on loopback ports.
deps-etcd:
	@if ! command -v etcd >/dev/null; then \
		echo "make: installing etcd-server (the etcd space's tests start their own servers)"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; \
	fi
	@# The partition test puts a host in a network namespace of its own (ip, iproute2).
	@command -v ip >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; }

build: deps
	$(SWIFT) build

# Builds everything once (library, CLI, tests), fails on any warning from this
# project's own sources, then runs the tests without rebuilding. The manual page is made
# first (the installation test installs it) and `man` is installed to read it.
TEST_WIDTH ?= 24
test: deps deps-etcd
	@mkdir -p .build
	$(SWIFT) build --build-tests 2>&1 | tee .build/build.log
	@if grep -E "^$(CURDIR)/(Sources|Tests)/.*: warning:" .build/build.log; then \
		echo "make: compiler warnings in this project's sources (listed above)"; exit 1; fi
	$(MAKE) --no-print-directory man CONFIG=debug
	@command -v man >/dev/null || { echo "make: installing man-db (the installation test reads the manual page)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq man-db; }
	@# A test mounts a loop device with ext4, then with a squashfs image.
	@{ [ -x /usr/bin/mksquashfs ] && [ -x /sbin/mkfs.ext4 ]; } || { echo "make: installing squashfs-tools and e2fsprogs (a test makes file system images)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq squashfs-tools e2fsprogs; }
	@# On a failure the failing tests are listed again at the end, where a log's
	@# tail shows them. At most 24 tests at once: with every test started together, the
	@# first minute on two cores spawns hundreds of processes and threads at once, and
	@# tests waiting on another process or thread pass their time limits.
	@$(SWIFT) test --skip-build --experimental-maximum-parallelization-width $(TEST_WIDTH) 2>&1 | tee .build/test.log || { status=$$?; \
		echo "make: the tests failed; the failing ones, from .build/test.log:"; \
		awk '/Test ".*" (recorded an issue|failed after)/ { keep = 1; print; next } \
			keep && /^[[:space:]]/ { print; next } { keep = 0 }' .build/test.log | tail -60; \
		exit $$status; }
	@# One plain closing line: XCTest's "Executed 0 tests" (it finds no XCTest cases)
	@# comes before Swift Testing's own summary, which counts the real tests.
	@sed -nE 's/.*Test run with ([0-9]+) tests? in .* passed after.*/tests: \1 passed, 0 failed/p' .build/test.log | tail -1

# The library's threads under ThreadSanitizer: the in-process suites of the I/O
# engines, of coordination (rules, center, presenters in this process) and of the
# watcher, built with --sanitize=thread (some 4 minutes here, and a minute to build).
# The watcher's suite runs in a process of its own: beside the others, every thread
# queues on one lock of the Swift runtime that the sanitizer's build takes on each
# metadata lookup, and the watcher falls 30 s behind (docs/reliability.md). Every
# process's reports go to .build-tsan/reports; the target fails if there is one. The one
# suppression (a runtime path, not our code) is explained in Tests/tsan-suppressions.txt;
# the locks are annotated (Sources/SystemCalls/LockedValue.swift). The deterministic
# simulator (SimulationTests) is left out: it runs on one thread, so the sanitizer has
# nothing to find in it, and instrumented its 3,000 seeds hold a core for longer than all
# the other suites together take.
# Each module's suites run in a process of their own, at most TSAN_WIDTH tests at once:
# with every test of two modules at once, the threads queued on that runtime lock made
# some 20 tests (kernel waits, gated batches, uncoordinated changes) miss their time
# limits, each of which passes alone in seconds. The filters are anchored: a bare
# "FileCoordinationTests" also matches NSFileCoordinationTests, whose suites start
# processes (left out, as the cross-process suites are).
TSAN_WIDTH ?= 3
TSAN_SKIP := SimulationTests
# allocator_may_return_null: a batch test reads a sparse file of terabytes, whose buffer
# the library asks malloc for and expects to be refused, as glibc's is.
TSAN_ENV = TSAN_OPTIONS="suppressions=$(CURDIR)/Tests/tsan-suppressions.txt log_path=$(CURDIR)/.build-tsan/reports/tsan halt_on_error=0 allocator_may_return_null=1"
test-tsan: deps
	$(SWIFT) build --build-tests --sanitize=thread --scratch-path .build-tsan
	@rm -rf .build-tsan/reports && mkdir -p .build-tsan/reports
	@status=0; for suites in '^AsyncFileIOTests\.' '^FileCoordinationTests\.' '^FileWatchingTests\.'; do \
		$(TSAN_ENV) $(SWIFT) test --skip-build --sanitize=thread --scratch-path .build-tsan --filter "$$suites" \
			--skip "$(TSAN_SKIP)" --experimental-maximum-parallelization-width $(TSAN_WIDTH) || status=1; \
	done; exit $$status
	@if ls .build-tsan/reports/tsan.* >/dev/null 2>&1; then \
		grep -h SUMMARY .build-tsan/reports/tsan.* | sort | uniq -c | sort -rn | head -40; \
		echo "make: ThreadSanitizer reports (summaries above, whole reports in .build-tsan/reports)"; exit 1; fi
	@echo "make: no ThreadSanitizer report"

# The C shims and the unsafe buffers (streams, range reads, batch reads, buffer
# recycling, directory listing) under AddressSanitizer: the in-process suites, built
# with --sanitize=address. Leak checking is off: the Swift runtime's caches read as leaks.
test-asan: deps
	$(SWIFT) build --build-tests --sanitize=address --scratch-path .build-asan
	@rm -rf .build-asan/reports && mkdir -p .build-asan/reports
	ASAN_OPTIONS="detect_leaks=0 allocator_may_return_null=1 log_path=$(CURDIR)/.build-asan/reports/asan" \
		$(SWIFT) test --skip-build --sanitize=address --scratch-path .build-asan --filter "AsyncFileIOTests|FileWatchingTests|FileCoordinationTests"
	@if ls .build-asan/reports/asan.* >/dev/null 2>&1; then cat .build-asan/reports/asan.* | head -80; \
		echo "make: AddressSanitizer reports (above)"; exit 1; fi
	@echo "make: no AddressSanitizer report"

# The etcd client's parsers (an answer's head, a chunked body, a watch's messages) under
# libFuzzer for FUZZ_SECONDS (10 minutes by default): Fuzz/EtcdParsersFuzzer.swift built
# with the parsers' sources by swiftc -sanitize=fuzzer,address. New inputs go to the
# working corpus in .build-fuzz/corpus (seeded from Fuzz/corpus), a finding to
# .build-fuzz/crash-*. `make test` feeds Fuzz/corpus and Fuzz/regressions to the same
# check (EtcdFuzzCorpusTests). Fuzz/README.md says more. Swift's own backtracer is off:
# libFuzzer reports the crash and keeps its input.
FUZZ_SECONDS ?= 600
FUZZ_SOURCES := $(addprefix Sources/FileCoordinationEtcd/,EtcdWire.swift EtcdJSON.swift EtcdAnswer.swift EtcdWatchMessage.swift EtcdWireCheck.swift) \
	Fuzz/EtcdParsersFuzzer.swift
fuzz: .build-fuzz/etcd-parsers
	@mkdir -p .build-fuzz/corpus
	SWIFT_BACKTRACE=enable=no .build-fuzz/etcd-parsers -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -dict=Fuzz/etcd-parsers.dict \
		-artifact_prefix=.build-fuzz/ -print_final_stats=1 .build-fuzz/corpus Fuzz/corpus Fuzz/regressions

.build-fuzz/etcd-parsers: $(FUZZ_SOURCES)
	@mkdir -p .build-fuzz
	$(SWIFTC) -sanitize=fuzzer,address -use-ld=lld -parse-as-library -O $(FUZZ_SOURCES) -o $@

# Merges the working corpus into Fuzz/corpus, keeping a small set of short inputs that
# cover what it covers.
fuzz-merge: .build-fuzz/etcd-parsers
	SWIFT_BACKTRACE=enable=no .build-fuzz/etcd-parsers -set_cover_merge=1 -max_len=512 Fuzz/corpus .build-fuzz/corpus

# The watcher's seeded model check at length: 50 seeds of 3,000 steps (some 4 minutes
# here); a failing seed is printed, and FILECOORD_WATCH_CHECK_SEED=N replays it.
watch-check: deps
	$(SWIFT) build --build-tests
	FILECOORD_WATCH_CHECK_SEEDS=$${FILECOORD_WATCH_CHECK_SEEDS:-50} \
	FILECOORD_WATCH_CHECK_STEPS=$${FILECOORD_WATCH_CHECK_STEPS:-3000} \
		$(SWIFT) test --skip-build --filter WatcherModelCheck

# The randomized cross-process checker at length: rounds of 5 worker processes with
# crossed claims, moves, presenters, SIGKILLs and SIGSTOPs for 10 minutes
# (FILECOORD_CHECK_SOAK_MINUTES); every round is checked, a failing one prints its seed,
# and FILECOORD_CHECK_SEED=N replays it. Figures: docs/reliability.md.
soak: deps
	$(SWIFT) build --build-tests
	FILECOORD_CHECK_SOAK_MINUTES=$${FILECOORD_CHECK_SOAK_MINUTES:-10} \
		$(SWIFT) test --skip-build --filter "CoordinationCheckTests/soak"

# The deterministic simulator at length: SEEDS seeds from FIRST (make test runs 1-3,000),
# or one SEED to replay, printing its steps when it fails. Figures: docs/reliability.md.
SEEDS ?= 100000
FIRST ?= 1
simulate: deps
	$(SWIFT) build --build-tests
	FILECOORD_SIM_SEEDS=$(SEEDS) FILECOORD_SIM_FIRST=$(FIRST) $(if $(SEED),FILECOORD_SIM_SEED=$(SEED)) \
		$(SWIFT) test --skip-build --filter "SimulationTests/seeds"

# Proof that the simulator finds defects by itself: known defects planted in the
# production code (the coordination machine, the plan, the serving ledger, the claim
# plan), one at a time; each must be found within the 3,000 seeds make test runs.
simulate-planted: deps
	SWIFT="$(SWIFT)" python3 scripts/simulate-planted.py $(BUGS)

# 1,000 concurrent writers (and 125 presenters) of one user under the default inotify
# instance limit, as a dedicated unprivileged uid (needs root to switch to it); some
# 10 minutes here. `make test` runs the same test with 150 writers.
limits: deps
	$(SWIFT) build --build-tests
	FILECOORD_MANY_WRITERS=$${FILECOORD_MANY_WRITERS:-1000} \
		$(SWIFT) test --skip-build --filter "manyProcessesUnderInstanceLimit"

# NSFileCoordination proved on code we did not write: GRDB 7.10.0's own
# DatabasePoolConcurrencyTests.testConcurrentOpening (50 rounds of 10 threads opening one
# database under NSFileCoordinator) and the helpers of its "Sharing a Database" guide,
# which GRDB skips on Linux. scripts/grdb-check.sh clones GRDB into .build-grdb (from the
# machine's package copy, GRDB_REPO), takes out only those `#if !canImport(Darwin)`
# skips, adds `import NSFileCoordination`, and runs the test against this package; it
# must pass. GRDB needs SQLite's headers (Debian: libsqlite3-dev). Not part of `make
# test`: GRDB's test target takes some minutes to build.
grdb-check: deps
	@[ -f /usr/include/sqlite3.h ] || { echo "make: installing libsqlite3-dev (GRDB links SQLite)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsqlite3-dev; }
	SWIFT=$(SWIFT) scripts/grdb-check.sh

# The DocC catalogs (Sources/FileCoordination/FileCoordination.docc,
# Sources/NSFileCoordination/NSFileCoordination.docc) and every public symbol's comment,
# as documentation archives under .build/plugins/Swift-DocC/outputs.
docs: deps
	$(SWIFT) package generate-documentation --target FileCoordination --target NSFileCoordination

demo: deps
	$(SWIFT) build -c release --product filecoord
	.build/release/filecoord demo

# The benchmark is its own package (it builds swift-nio for the peer comparison).
bench: deps deps-etcd static-archives
	@command -v inotifywait >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq inotify-tools; }
	$(SWIFT) build -c release --package-path Benchmarks --scratch-path .build-bench
	@# The command-line figure runs the tool as `make install` builds it.
	$(SWIFT) build -c release --product filecoord $(INSTALL_FLAGS)
	FILECOORD_BIN=$(INSTALL_BUILD)/release/filecoord .build-bench/release/filecoord-bench

# make install [PREFIX=/usr/local] [DESTDIR=...] [STATIC=0]: the filecoord binary, its
# manual page (generated from its help by swift-argument-parser's plugin) and its bash,
# zsh and fish completions. The binary has the Swift runtime and Foundation linked in:
# it starts in about two thirds of the time (no dynamic loading of the runtime's
# libraries; docs/performance.md) and runs on a machine without the toolchain
# (only glibc is needed there). It is built in a directory of its own, so
# that it and the dynamic builds (`make demo`, the manual's plugin) do not rebuild each
# other. STATIC=0 installs the dynamic build instead (also for a toolchain that lacks the
# static Swift libraries).
PREFIX ?= /usr/local
CONFIG ?= release
STATIC ?= 1
IS_STATIC := $(filter-out 0 no false,$(STATIC))
INSTALL_BUILD := $(if $(IS_STATIC),.build-static,.build)
# Not position-independent: the loader then has no relative relocations to apply, and
# start-up touches fewer pages (docs/performance.md). The cost: the executable, and so the
# Swift runtime and Foundation linked into it, sits at a fixed address; the shared
# libraries, stack and heap are still placed at random.
# libstdc++ (the Swift runtime's C++ library), libgcc and libinotifytools are linked in
# too, from their static archives, and the executable's own symbols are not exported
# (the toolchain's default for a static standard library exports them): the loader then
# resolves no symbol of those libraries at start-up, and a machine that runs the binary
# needs only glibc. The archives are found through a directory of links to them, ahead
# of the shared libraries of the same names (`-lstdc++` comes from the toolchain). With
# no library of its own beside it, the binary has no `$ORIGIN` run path
# (`--disable-local-rpath`): the loader looks for libc only where the system keeps it.
STATIC_ARCHIVES := .build-static/archives
INSTALL_FLAGS := $(if $(IS_STATIC),--static-swift-stdlib -Xswiftc -Xclang-linker -Xswiftc -no-pie \
	-Xswiftc -Xclang-linker -Xswiftc -static-libgcc -Xlinker --no-export-dynamic -Xlinker -L$(CURDIR)/$(STATIC_ARCHIVES) \
	--disable-local-rpath --scratch-path .build-static)
MANUAL := .build/plugins/GenerateManual/outputs/filecoord/filecoord.1
install: deps static-archives
	$(MAKE) --no-print-directory man
	$(SWIFT) build -c $(CONFIG) --product filecoord $(INSTALL_FLAGS)
	$(MAKE) --no-print-directory install-files INSTALL_FROM=$(INSTALL_BUILD)

# The links to the static archives for the static build, found by the toolchain's clang
# (beside the swift that builds; else the clang or gcc on PATH). An archive not found is
# said, and that library is then linked as a shared one.
TOOLCHAIN_CLANG = $(dir $(realpath $(shell command -v $(SWIFT))))clang
static-archives: deps
	@if [ -n "$(IS_STATIC)" ]; then mkdir -p $(STATIC_ARCHIVES); \
		compiler="$(TOOLCHAIN_CLANG)"; [ -x "$$compiler" ] || compiler=$$(command -v clang || command -v gcc); \
		for archive in libstdc++.a libinotifytools.a; do path=$$("$$compiler" -print-file-name=$$archive 2>/dev/null); \
			if [ -f "$$path" ]; then ln -sf "$$path" $(STATIC_ARCHIVES)/$$archive; \
			else rm -f $(STATIC_ARCHIVES)/$$archive; \
				echo "make: $$archive not found ($$compiler): the static build links that library as a shared one"; fi; \
		done; fi

man: deps
	$(SWIFT) package generate-manual --configuration $(CONFIG)

# Copies a build into the prefix; nothing is built here. `install` names the build it made
# (INSTALL_FROM); alone, this copies from .build (the dynamic build of CONFIG).
INSTALL_FROM ?= .build
install-files:
	install -D -m 755 $(INSTALL_FROM)/$(CONFIG)/filecoord $(DESTDIR)$(PREFIX)/bin/filecoord
	install -D -m 644 $(MANUAL) $(DESTDIR)$(PREFIX)/share/man/man1/filecoord.1
	mkdir -p $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
		$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	$(INSTALL_FROM)/$(CONFIG)/filecoord --generate-completion-script bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/filecoord
	$(INSTALL_FROM)/$(CONFIG)/filecoord --generate-completion-script zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_filecoord
	$(INSTALL_FROM)/$(CONFIG)/filecoord --generate-completion-script fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/filecoord.fish

clean:
	rm -rf .build .build-bench .build-static .build-fuzz
