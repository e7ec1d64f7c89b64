-- expect: too_much_memory.lua: recipe used more than 64 MiB
local s = string.rep("x", 100 * 1024 * 1024)
