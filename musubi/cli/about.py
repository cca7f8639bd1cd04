"""`musubi schema` and `musubi env`: the job fields, and this machine in one block for a bug report."""

from __future__ import annotations

import json

import typer


def schema_command() -> None:
    """Print every job YAML field with its type, default and meaning (markdown)."""
    from musubi.config.schema_doc import schema_markdown

    print(schema_markdown())


def env_command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """One block describing this machine and stack, to paste into a bug report."""
    from musubi.store.rundir import env_record

    rec = env_record()
    if as_json:
        print(json.dumps(rec, indent=1))
        return
    import musubi

    print(f"musubi {musubi.__version__}")
    for k, v in rec.items():
        if k == "musubi":  # the first line says it
            continue
        if k == "packages":
            print("packages:")
            width = max((len(name) for name in v), default=0)
            for name, version in v.items():
                print(f"  {name:<{width}}  {version}")
        elif k == "project":
            print("project: " + (f"{v['root']} at {(v['commit'] or '')[:12]} ({v['branch']}"
                                 f"{', ' + str(v['changed_files']) + ' changed file(s)' if v['dirty'] else ''})"
                                 if v else "(the working directory is not in a git repository)"))
        elif k == "gpus":
            if not v:
                print("gpus: none visible (CPU ranks on gloo)")
            for g in v:
                print(f"gpu{g['index']}: {g['name']} {g['memory_gib']} GiB driver {g['driver']} {g['uuid']}")
        elif k == "topology":
            from musubi.topology import NodeTopology

            print("topology: " + NodeTopology.from_dict(v).summary())
        elif k == "env":
            print("env: " + (" ".join(f"{name}={value}" for name, value in v.items()) or "(no training variables set)"))
        else:
            print(f"{k}: {v}")
