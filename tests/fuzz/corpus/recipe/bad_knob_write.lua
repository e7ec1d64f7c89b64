-- expect: knob_write.lua:3: knobs are read-only: change 'width' with --set width=VALUE or in knobs { ... }
local k = knobs { width = 32 }
k.width = 64
