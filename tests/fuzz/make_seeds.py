#!/usr/bin/env python3
"""Writes the generated seed inputs of tests/fuzz/corpus/ (shards, safetensors files, JSON
documents, tokenizer triples, checkpoints): small, valid examples of each format, made the
way the trainer writes them. The recipe and cluster seeds are not copied here: the fuzz
targets read the test recipes and cluster files where they live (tests/fuzz/CMakeLists.txt).
Run from anywhere: python3 tests/fuzz/make_seeds.py"""
import hashlib, json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
C = os.path.join(HERE, 'corpus')
SEP = b'\n=====\n'  # fuzz.h's FZ_SEP


def put(target, name, data):
    os.makedirs(os.path.join(C, target), exist_ok=True)
    with open(os.path.join(C, target, name), 'wb') as f:
        f.write(data if isinstance(data, bytes) else data.encode('utf-8', 'surrogateescape'))


def shard(magic, ver, toks, w):
    h = struct.pack('<3i', magic, ver, len(toks)) + b'\0' * (1024 - 12)
    return h + b''.join(struct.pack('<H' if w == 2 else '<I', t) for t in toks)


def st(tensors, meta=None):
    """A safetensors file: u64 header length, JSON header, data."""
    hdr, data = {}, b''
    if meta:
        hdr['__metadata__'] = meta
    for name, dt, shape, raw in tensors:
        hdr[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    return struct.pack('<Q', len(h)) + h + data


def f32(v):
    return struct.pack('<%df' % len(v), *v)


def crc32c(b):
    crc = 0xffffffff
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82f63b78 & -(crc & 1))
    return crc ^ 0xffffffff


def checkpoint(ranks, tensors, crc_line, guard=False):
    """manifest + SEP + rank files. tensors: (name, shape, [(rank, key, start, shape)])."""
    recipe = 'model { vocab = 4, dim = 2, seq_len = 2, embedding {}, lm_head {} }\n'
    files = [{} for _ in range(ranks)]
    m = ['format: trainer-checkpoint', 'version: 1', 'step: 2', 'adam_steps: 2',
         'recipe_sha256: ' + hashlib.sha256(recipe.encode()).hexdigest(),
         'recipe: |', *('  ' + l for l in recipe.splitlines()),
         'parallel:', '  world: %d' % ranks, '  dp: %d' % ranks, '  tp: 1', '  pp: 1',
         '  chunks: 1', '  zero: 0', '  sequence_parallel: false', 'rng:', '  seed: 1',
         'loader_position:', '  bytes: 224', '  hex: "' + '00' * 224 + '"']
    if guard:  # the guard's state, as trainer/checkpoint/manifest.c writes it
        m += ['guard:', '  window: 4', '  next: 2', '  loss:', '  - 3.25', '  - 3.125',
              '  grad_norm:', '  - 1.5', '  - 1.25', '  bad: 0', '  first_bad: 0',
              '  last_loss: 3.125', '  last_grad_norm: 1.25', '  rolled_to: 0']
    m.append('files:')
    blobs = []
    for name, shape, slices in tensors:
        for r, key, start, sh in slices:
            n = sh[0] * (sh[1] if len(sh) > 1 else 1)
            files[r][key] = (sh, f32([0.25 * i - 1 for i in range(n)]))
    for r in range(ranks):
        blobs.append(st([(k, 'F32', sh, raw) for k, (sh, raw) in files[r].items()],
                        {'format': 'trainer-checkpoint', 'rank': str(r)}))
        m += ['- name: rank_%05d.safetensors' % r, '  rank: %d' % r, '  mesh: [%d, 0, 0]' % r,
              '  bytes: %d' % len(blobs[r])]
    m.append('tensors:')
    for name, shape, slices in tensors:
        m += ['- name: ' + name, '  dtype: F32', '  shape: %s' % shape, '  slices:']
        for r, key, start, sh in slices:
            m += ['  - file: rank_%05d.safetensors' % r, '    key: ' + key,
                  '    start: %s' % start, '    shape: %s' % sh,
                  '    crc32c: %08x' % crc32c(files[r][key][1])]
    text = ('\n'.join(m) + '\n').encode()
    if crc_line:
        text += b'# crc32c: %08x\n' % crc32c(text)
    return SEP.join([text] + blobs)


def main():
    put('shard', 'u16.bin', shard(20240520, 1, [50256, 15496, 11, 995, 0, 65535], 2))
    put('shard', 'u32.bin', shard(20240801, 7, [100000, 1, 2, 3, 128255], 4))
    put('shard', 'u16_empty.bin', shard(20240520, 1, [], 2))
    put('shard', 'bad_count.bin', shard(20240520, 1, [1, 2, 3], 2)[:-2])

    put('safetensors', 'f32.safetensors', st([('wte', 'F32', [2, 3], f32([1, 2, 3, 4, 5, 6])),
                                              ('b', 'F32', [3], f32([0.5, -1, 2]))],
                                             {'format': 'pt'}))
    put('safetensors', 'half.safetensors',
        st([('h', 'F16', [4], struct.pack('<4H', 0x3c00, 0x0001, 0x7c00, 0xfc01)),
            ('bf', 'BF16', [2, 1], struct.pack('<2H', 0x3f80, 0x8000))]))
    put('safetensors', 'other.safetensors', st([('i', 'I64', [1], struct.pack('<q', 7)),
                                                ('s', 'F32', [], f32([3]))]))
    put('safetensors', 'empty.safetensors', st([]))

    put('json', 'config.json', '{"architectures":["GPT2LMHeadModel"],"n_embd":768,"n_head":12,'
        '"layer_norm_epsilon":1e-05,"tie_word_embeddings":true,"vocab_size":50257,'
        '"bos_token_id":null,"x":false}')
    put('json', 'encoder.json', '{"!": 0, "\\"": 1, "\\u0120the": 262, "\\u00e9t\\u00e9": 7, '
        '"<|endoftext|>": 50256}')
    put('json', 'escapes.json', '["\\ud83d\\ude00", "\\n\\t\\\\\\/\\b\\f\\r", "caf\\u00e9", '
        '"\u00e9\u20ac\U0001F600", -0.0, 1.5e300, -12, 0, [], {}, [[[]]]]')
    put('json', 'jsonl.json', '{"text": "one"}\n{"text": "two", "id": 2}\n[1,2]\n"s"\n3.25\ntrue\nnull\n')
    put('json', 'metrics.json', '{"step":10,"loss":5.25,"lr":0.0006,"grad_norm":1.25,'
        '"tokens_per_s":12345.6,"t":3.5}')

    # GPT-2's 256 byte tokens, its first merges and the tokens they make (ids in merge order)
    enc = json.load(open(os.path.join(ROOT, 'data/gpt2/encoder.json'), encoding='utf-8'))
    lines = open(os.path.join(ROOT, 'data/gpt2/vocab.bpe'), encoding='utf-8').read().split('\n')
    for name, n, eot, text in [
            ('gpt2_small', 40, True, 'Hello world, the thing is there.\n  \u00dcn\u00efcode '
             '\udcff\udcfe bytes 123 \'s\'ll'),
            ('gpt2_tiny', 10, False, "in the end they're at it  \t\n\n")]:
        e = {k: v for k, v in enc.items() if v < 256}
        for r in lines[1:1 + n]:
            a, b = r.split(' ')
            e[a + b] = len(e)
        if eot:
            e['<|endoftext|>'] = len(e)
        merges = lines[0] + '\n' + '\n'.join(lines[1:1 + n]) + '\n'
        put('tokenizer', name, SEP.join([json.dumps(e, ensure_ascii=False).encode(),
                                         merges.encode(), text.encode('utf-8', 'surrogateescape')]))
    put('tokenizer', 'byte_only', b'just text for the byte tokenizer \x80\xc3')

    put('manifest', 'one_rank', checkpoint(1, [
        ('a', [2, 3], [(0, 'a', [0, 0], [2, 3])]),
        ('b', [5], [(0, 'b.0', [0], [2]), (0, 'b.1', [2], [3])]),
        ('adam_m/a', [2, 3], [(0, 'adam_m/a', [0, 0], [2, 3])])], crc_line=False))
    put('manifest', 'two_ranks', checkpoint(2, [
        ('w', [4, 2], [(0, 'w', [0, 0], [2, 2]), (1, 'w', [2, 0], [2, 2])]),
        ('v', [2, 4], [(0, 'v', [0, 0], [2, 1]), (1, 'v', [0, 1], [2, 3])])], crc_line=True,
        guard=True))


if __name__ == '__main__':
    main()
