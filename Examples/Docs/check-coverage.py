#!/usr/bin/env python3
"""Fails unless every public symbol of a module (Promise, PromiseNIO) has a doc comment and an example.

    python3 Examples/Docs/check-coverage.py ARCHIVE/documentation-coverage.json

Reads the coverage file that `docc convert --experimental-documentation-coverage` writes
(`make docs` asks for it). A symbol passes when it has an abstract (the first paragraph
of its doc comment) and a code listing (in its doc comment, or added by an extension
file in Sources/Promise/Promise.docc/Extensions/). Members that Swift synthesises from
the standard library or Foundation (`!=`, `localizedDescription`, `LocalizedError`'s
`failureReason`, `helpAnchor`, `recoverySuggestion`) carry Apple's documentation, not
ours, and are skipped, as are the pages DocC makes for groups, extended modules and
extended types (another module's type that PromiseNIO extends: an extension has no doc
comment of its own).
"""

import json
import sys

INHERITED = {"!=(_:_:)", "localizedDescription", "failureReason", "helpAnchor", "recoverySuggestion"}
NOT_SYMBOLS = {"org.swift.docc.kind.extendedModule", "org.swift.docc.kind.collectionGroup",
               "org.swift.docc.kind.module", "org.swift.docc.kind.extendedProtocol",
               "org.swift.docc.kind.extendedClass", "org.swift.docc.kind.extendedStructure",
               "org.swift.docc.kind.extendedEnumeration"}


def main(path):
    with open(path) as f:
        entries = json.load(f)
    checked, missing = 0, []
    for entry in entries:
        kind = entry.get("kind", {})
        if not kind.get("isSymbol") or kind.get("id") in NOT_SYMBOLS or entry["title"] in INHERITED:
            continue
        checked += 1
        lacks = [what for what, key in (("doc comment", "hasAbstract"), ("example", "hasCodeListing"))
                 if not entry.get(key)]
        if lacks:
            name = entry["referencePath"].split("/documentation/", 1)[-1]
            missing.append("%s (%s): no %s" % (name, kind.get("name"), " and no ".join(lacks)))
    for line in sorted(missing):
        print("docs: " + line)
    print("docs: %d public symbols checked, %d missing a doc comment or an example"
          % (checked, len(missing)))
    return 1 if missing or checked == 0 else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
