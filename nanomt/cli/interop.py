"""`nanomt import marian` and `nanomt export ct2|onnx|marian|argos`: other toolkits' models in, ours out."""

from __future__ import annotations

import argparse

from nanomt.cli import require_extra


def import_model(args: argparse.Namespace) -> None:
    from nanomt.core.checkpoint import check_new_dir
    from nanomt.interop.marian import import_marian

    print(f"run directory: {import_marian(args.hf_dir, check_new_dir(args.out, '--out'))}")


def export(args: argparse.Namespace) -> None:
    from nanomt.core.checkpoint import check_new_dir

    if args.target != "argos":  # a package is one file, replaced whole (nanomt.interop.argos)
        check_new_dir(args.out, "--out")
    try:
        if args.target == "ct2":
            from nanomt.interop.ct2 import export_ct2

            out = export_ct2(args.run, args.out, quantization=args.quantization)
        elif args.target == "marian":
            from nanomt.interop.marian_export import export_marian

            out = export_marian(args.run, args.out)  # several checkpoints (an ensemble) are refused there
        elif args.target == "argos":
            from nanomt.interop.argos import export_argos

            languages, names = (args.source_language, args.target_language), (args.source_name, args.target_name)
            out = export_argos(args.run, args.out, *languages, names, args.package_version, args.quantization)
        else:
            # torch.onnx needs the onnx package, and fails with a traceback of its own without it.
            require_extra("export", "exporting to ONNX needs the onnx package", ("onnx",))
            from nanomt.interop.onnx import export_onnx

            out = export_onnx(args.run, args.out)
    except ImportError as e:  # the optional engine is missing; the message carries the install hint
        raise ValueError(str(e)) from None
    print(f"exported to {out}")
