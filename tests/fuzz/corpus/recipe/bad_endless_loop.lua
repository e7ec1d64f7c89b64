-- expect: endless_loop.lua:3: recipe did not finish within 100000000 instructions (an endless loop?)
local n = 0
while true do n = n + 1 end
