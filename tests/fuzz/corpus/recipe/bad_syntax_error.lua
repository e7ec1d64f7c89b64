-- expect: syntax_error.lua:3: '}' expected (to close '{' at line 2) near 'dim'
model {
  vocab = 256 dim = 32, seq_len = 16,
}
