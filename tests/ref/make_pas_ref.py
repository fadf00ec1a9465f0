#!/usr/bin/env python3
"""Pan & scan in the prompt: what transformers' Gemma3Processor writes (run by hand, never in CI).

Writes tests/ref/pas_ref.json: one chat with two images - tests/ref/images/wide.jpg (1000 x 300:
three pan & scan crops) then tall.jpg (300 x 700: two) - and one with chelsea.png (451 x 300: wide
enough to start pan & scan, 451 / 300 >= 1.2, but two crops would be narrower than the 256-pixel
minimum, so none: the image's plain block, no sentence), each through
Gemma3Processor(do_pan_and_scan=True) with the tiny multimodal model's tokenizer
(tests/ref/tiny_gemma3_vision_chat, 4 soft tokens per image):

  cases[i].text        the chat as Gemma's template renders it, one "<start_of_image>" per image
  cases[i].images      the image files (relative to tests/ref/images)
  cases[i].num_crops   the processor's num_crops per image
  cases[i].input_ids   the processor's input_ids
  cases[i].n_pixel_values  rows of its pixel_values (each image, then its crops)

The processor expands each image into "Here is the original image " + the image's block + " and
here are some crops to help you see better " + the crops' blocks joined by " " (processing_gemma3.py,
Gemma3Processor.replace_image_token), a block being "\n\n<start_of_image>" + soft tokens +
"<end_of_image>\n\n". transformers 5.24's PreTrainedTokenizerFast numbers the tokenizer file's
three image tokens (509, 510, 511 in tokenizer.json, after a 426-piece vocabulary) from 430 on;
their ids are mapped back by content, every other id is the file's.

Needs the peers venv (tests/peers/setup.sh) plus Pillow, e.g.
  pip install --target /tmp/pil pillow
  PYTHONPATH=/tmp/pil ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_pas_ref.py
"""
import json
import os

import numpy as np

from PIL import Image
from transformers import Gemma3ImageProcessorPil, Gemma3Processor, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "tiny_gemma3_vision_chat", "tokenizer.json")
IMAGES = os.path.join(HERE, "images")
SIZE = 56          # the tiny tower's image side (config.json vision_config.image_size)
SOFT_TOKENS = 4    # mm_tokens_per_image
# pan & scan on, with the processor's defaults (Gemma3ProcessorKwargs)
PAS = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=256, pan_and_scan_max_num_crops=4,
           pan_and_scan_min_ratio_to_activate=1.2)

CASES = [
    ("<start_of_turn>user\n<start_of_image>Which is wider?<start_of_image><end_of_turn>\n"
     "<start_of_turn>model\nThe first<end_of_turn>\n", ["wide.jpg", "tall.jpg"]),
    ("<start_of_turn>user\n<start_of_image>What is it?<end_of_turn>\n<start_of_turn>model\nA cat<end_of_turn>\n",
     ["chelsea.png"]),
]


def main():
    with open(TOK) as f:
        added = {a["content"]: a["id"] for a in json.load(f)["added_tokens"]}
    tok = PreTrainedTokenizerFast(tokenizer_file=TOK, extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    remap = {tok.convert_tokens_to_ids(c): i for c, i in added.items()}
    proc = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": SIZE, "width": SIZE}), tokenizer=tok,
                           image_seq_length=SOFT_TOKENS)
    out = []
    for text, files in CASES:
        imgs = [Image.open(os.path.join(IMAGES, p)).convert("RGB") for p in files]
        r = proc(text=[text], images=[imgs], return_tensors="np", add_special_tokens=True, **PAS)
        ids = [remap.get(int(i), int(i)) for i in r["input_ids"][0]]
        # (the processor drops num_crops from its output: asked of its image processor)
        crops = [int(c) for c in np.asarray(proc.image_processor(imgs, return_tensors="np", **PAS)["num_crops"]).ravel()]
        out.append({"text": text, "images": files, "num_crops": crops, "input_ids": ids,
                    "n_pixel_values": int(r["pixel_values"].shape[0])})
        print(f"{files}: num_crops {crops}, {len(ids)} ids, pixel_values {r['pixel_values'].shape}")
    with open(os.path.join(HERE, "pas_ref.json"), "w") as f:
        json.dump({"source": "transformers Gemma3Processor, do_pan_and_scan=True (tests/ref/make_pas_ref.py)",
                   "size": SIZE, "soft_tokens": SOFT_TOKENS, "cases": out}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
