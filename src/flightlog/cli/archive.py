"""Archive a run's logs (and with --checkpoints its checkpoint-N folders) as one
compressed tar.gz to a local folder or any fsspec URL (s3://bucket/runs, oss://...
once its fsspec backend is installed). The archive is verified by restoring it, then
the index points at it and 'flightlog show' says where it is. Local files are kept.

  flightlog archive llama3-lora s3://team-runs/2026/
  flightlog archive --restore llama3-lora ./restored     # unpack it again"""

from __future__ import annotations

import argparse

from flightlog.cli._runs import CommandError, find_run, open_index, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run id, id prefix, name or folder")
    parser.add_argument("dest", metavar="DEST", help="folder or URL to write to (or, with --restore, to unpack into)")
    parser.add_argument("--checkpoints", action="store_true", help="include the checkpoint-N folders (can be large)")
    parser.add_argument("--force", action="store_true", help="archive a run that is still running")
    parser.add_argument("--restore", action="store_true", help="unpack the run's archive into DEST and index the copy")


def _main(args: argparse.Namespace) -> int:
    from flightlog.store.archive import ArchiveError, archive_run, restore
    from flightlog.store.entry import entry_from_run_dir

    try:
        if args.restore:
            url = args.run if "://" in args.run or args.run.endswith((".tar.gz", ".tgz")) else find_run(args.run).get("archive")
            if not url:
                raise CommandError(f"run {args.run!r} has no archive (flightlog archive RUN DEST first)")
            log_dir = restore(url, args.dest)
            entry = entry_from_run_dir(log_dir)
            with open_index(create=True) as index:
                index.upsert(entry)
                if not index.get(entry["run_id"]).get("archive"):
                    index.set_archive(entry["run_id"], url)
            print(f"restored run {entry['run_id']} from {url} into {log_dir}")
            return 0
        run = find_run(args.run)
        if run["status"] == "running" and not args.force:
            raise CommandError(f"run {run['run_id']} is still running; archive it when it ends (or --force)")
        done = archive_run(run["run_id"], run.get("log_dir") or "", args.dest, run["checkpoints"] if args.checkpoints else [])
    except ArchiveError as exc:
        raise CommandError(str(exc)) from None
    with open_index() as index:
        index.set_archive(run["run_id"], done.url)
    print(f"archived run {run['run_id']} ({len(done.files)} files, {done.bytes} bytes, verified) to {done.url}")
    return 0


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
