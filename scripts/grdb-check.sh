#!/usr/bin/env bash
# `make grdb-check`: GRDB's own test of concurrent opening under NSFileCoordinator, on
# Linux, against this package's NSFileCoordination.
#
# GRDB 7.10.0 is cloned into .build-grdb (from GRDB_REPO: the machine's package copy)
# and patched there, never in this repository: its test target gains a dependency on
# this package's NSFileCoordination product; DatabasePoolConcurrencyTests.swift gains
# `import NSFileCoordination` and loses only the three
#   #if !canImport(Darwin) / throw XCTSkip("NSFileCoordinator unavailable") / #else ... #endif
# guards (testConcurrentOpening, and the openSharedDatabase(at:) and
# openSharedReadOnlyDatabase(at:) helpers of GRDB's "Sharing a Database" guide, which
# must compile). Then testConcurrentOpening runs, and must pass, not skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repo=${GRDB_REPO:-/opt/swift-packages/groue/GRDB.swift.git}
version=${GRDB_VERSION:-7.10.0}
work="$root/.build-grdb"
grdb="$work/GRDB.swift"
swift=${SWIFT:-swift}

if [ ! -d "$grdb/.git" ]; then
    mkdir -p "$work"
    git clone --quiet "$repo" "$grdb"
fi
# GRDB's tracked files as released; its build folder stays, for the next run.
git -C "$grdb" checkout --quiet --force "$version"
git -C "$grdb" checkout --quiet --force -- .

python3 - "$grdb" "$root" <<'PY'
import json, os, re, sys
grdb, root = sys.argv[1], sys.argv[2]
identity = os.path.basename(root)

def patch(path, edit):
    with open(path) as f: text = f.read()
    text = edit(text)
    with open(path, "w") as f: f.write(text)

def once(text, old, new, what):
    if text.count(old) != 1: sys.exit(f"grdb-check: {what}: expected once in GRDB {os.environ.get('GRDB_VERSION', '7.10.0')}, found {text.count(old)}")
    return text.replace(old, new)

def package(text):
    text = once(text, "var dependencies: [PackageDescription.Package.Dependency] = []\n",
                "var dependencies: [PackageDescription.Package.Dependency] = []\n"
                f"dependencies.append(.package(path: {json.dumps(root)}))\n", "the dependencies list")
    return once(text, '            dependencies: ["GRDB"],\n            path: "Tests",',
                f'            dependencies: ["GRDB", .product(name: "NSFileCoordination", package: "{identity}")],\n            path: "Tests",',
                "the test target's dependencies")

guard = '#if !canImport(Darwin)\n        throw XCTSkip("NSFileCoordinator unavailable")\n#else\n'

def tests(text):
    text = once(text, "import Foundation\n", "import Foundation\nimport NSFileCoordination\n", "import Foundation")
    removed = 0
    while guard in text:
        start = text.index(guard)
        # The guard's own #endif: the first one at its nesting level after it.
        depth, position = 0, start + len(guard)
        for match in re.finditer(r"^#(if|endif)\b.*\n", text[position:], re.M):
            if match.group(1) == "if": depth += 1
            elif depth == 0:
                end = position + match.start()
                text = text[:start] + text[start + len(guard):end] + text[end + len(match.group(0)):]
                break
            else: depth -= 1
        else:
            sys.exit("grdb-check: a guard without its #endif")
        removed += 1
    if removed != 3 or "NSFileCoordinator unavailable" in text:
        sys.exit(f"grdb-check: expected the 3 guards (testConcurrentOpening and the two helpers), removed {removed}")
    return text

patch(f"{grdb}/Package.swift", package)
patch(f"{grdb}/Tests/GRDBTests/DatabasePoolConcurrencyTests.swift", tests)
print("grdb-check: GRDB patched: NSFileCoordination imported, 3 guards removed")
PY

"$swift" build --build-tests --package-path "$grdb"
log="$work/test.log"
"$swift" test --skip-build --package-path "$grdb" --filter 'DatabasePoolConcurrencyTests/testConcurrentOpening' 2>&1 | tee "$log"
if grep -q "skipped" "$log" || ! grep -Eq "Executed 1 test, with 0 failures" "$log"; then
    echo "grdb-check: testConcurrentOpening did not run and pass (above)"; exit 1
fi
echo "grdb-check: GRDB $version testConcurrentOpening passed with NSFileCoordination"
