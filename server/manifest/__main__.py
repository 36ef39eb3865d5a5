"""`python -m server.manifest --doc | --json-schema | --check M.YAML [KEY=VALUE ...]`."""

import json
import sys

from server.manifest.doc import json_schema, schema_doc
from server.manifest.loading import ManifestError, load_manifest

if sys.argv[1:] == ["--doc"]:
    print(schema_doc())
elif sys.argv[1:] == ["--json-schema"]:
    print(json.dumps(json_schema(), indent=2))
elif len(sys.argv) >= 2 and sys.argv[1] == "--check":
    try:
        print(load_manifest(sys.argv[2], sys.argv[3:]).to_yaml(), end="")
    except (ManifestError, IndexError) as exc:
        print(f"server.manifest: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
else:
    print("usage: python -m server.manifest --doc | --json-schema | --check M.YAML [KEY=VALUE ...]")
