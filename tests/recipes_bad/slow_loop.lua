-- expect: slow_loop.lua:4: recipe ran for more than 10 s (an endless loop, or work too slow for a recipe)
-- few instructions, each a long library call: the time limit stops it, not the instruction count
local s = ("x"):rep(1e7)
for i = 1, 1e6 do local u = s:upper() end
