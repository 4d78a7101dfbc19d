"""Train-style read of an ingested Cassandra dataset with DALI: the README's runnable example.

    eval "$(.venv/bin/imgest services env)"   # or IMGEST_CASSANDRA_HOSTS=<your contact points>
    .venv/bin/python examples/read_cassandra.py --table imgest.data \
        --split-file .imgest/work/imagenet-sample/split-cassandra.npz

Reads part 0 of the split file through imgest's Cassandra reader into a DALI pipeline that decodes, random-
resize-crops to 224, flips and normalizes (on the GPU with `--gpu`), for one epoch, and prints what it read.
"""

from __future__ import annotations

import argparse
import time

from nvidia.dali import Pipeline, fn, types

from imgest.readback import get_cassandra_reader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", default="imgest.data", help="keyspace.data_table")
    p.add_argument("--split-file", required=True, help="split file written by `imgest split` or the DAG")
    p.add_argument("--part", type=int, default=0, help="which part of the split (default 0: train)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--gpu", action="store_true", help="decode with DALI's mixed decoder on GPU 0")
    args = p.parse_args()

    source = get_cassandra_reader(args.table, split_file=args.split_file, part=args.part, batch_size=args.batch_size)
    pipe = Pipeline(batch_size=args.batch_size, num_threads=2, device_id=0 if args.gpu else None)
    with pipe:
        jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT32])
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if args.gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mirror=fn.random.coin_flip(),
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
            std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
        )
        pipe.set_outputs(images, labels)
    pipe.build()
    seen, t0 = 0, time.perf_counter()
    try:
        while True:
            _, batch_labels = pipe.run()
            seen += len(batch_labels)
    except StopIteration:
        pass
    seconds = time.perf_counter() - t0
    print(f"read {seen} images in {seconds:.2f}s ({seen / seconds:.0f} images/s), shape 3x224x224")
    source.close()


if __name__ == "__main__":
    main()
