# Writes the build's provenance (trainer/report/provenance.h's tr_build) as C into OUT, at every
# build
# (a custom target runs it), rewriting the file only when it changed: the commit and whether
# the tree had changes come from git at build time, so a rebuild after a commit updates them;
# without git (a tarball) the commit is "unknown". Called with -DSRC -DOUT -DVERSION -DTYPE
# -DCOMPILER -DFLAGS -DCUDA -DSANITIZE -DNATIVE.
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
    # the source folder's own repository: not one a tarball was unpacked inside
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --show-toplevel
        OUTPUT_VARIABLE top RESULT_VARIABLE rc_top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --short=12 HEAD
        OUTPUT_VARIABLE head RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    get_filename_component(src_real "${SRC}" REALPATH)
    get_filename_component(top_real "${top}" REALPATH)
    if(rc EQUAL 0 AND rc_top EQUAL 0 AND head AND src_real STREQUAL top_real)
        set(commit ${head})
        # tracked files changed, or files git does not ignore added: the tree is not the commit
        execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} status --porcelain
            OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
        if(NOT rc EQUAL 0 OR changes)
            set(commit "${commit}-dirty")
        endif()
    endif()
endif()
string(TIMESTAMP built "%Y-%m-%d" UTC)
# C string literals: backslashes and quotes escaped
foreach(v VERSION TYPE COMPILER FLAGS CUDA SANITIZE NATIVE commit built)
    string(REPLACE "\\" "\\\\" e "${${v}}")
    string(REPLACE "\"" "\\\"" e "${e}")
    string(STRIP "${e}" e)
    set(c_${v} "${e}")
endforeach()
set(text "/* Made by trainer/build_info.cmake at build time: do not edit. */
#include \"trainer/report/provenance.h\"

const tr_build_info tr_build = {
    .version = \"${c_VERSION}\",
    .commit = \"${c_commit}\",
    .built = \"${c_built}\",
    .type = \"${c_TYPE}\",
    .compiler = \"${c_COMPILER}\",
    .flags = \"${c_FLAGS}\",
    .cuda = \"${c_CUDA}\",
    .sanitize = \"${c_SANITIZE}\",
    .native = \"${c_NATIVE}\",
};
")
file(WRITE ${OUT}.new "${text}")
configure_file(${OUT}.new ${OUT} COPYONLY) # touches OUT only when it changed
file(REMOVE ${OUT}.new)
