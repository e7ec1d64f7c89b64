-- expect: slow_library_call.lua: recipe ran for more than 15 s inside one library call
-- string.find backtracks 2^40 times inside one C call, which no instruction count sees
string.rep("x", 40):find(string.rep("x?", 40) .. string.rep("x", 40))
