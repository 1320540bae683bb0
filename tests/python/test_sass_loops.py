"""kernels/tools/sass_loops.py: the loop opcode mix read from both SASS listing formats."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "kernels", "tools", "sass_loops.py")

# One kernel with a prologue, a forward branch, a loop of eight instructions (two FP32 of them guarded) and the
# back edge; a second kernel whose only loop holds no IMMA. As nvdisasm -c writes it ...
NVDISASM = """
.text._Z4gemmv:
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/              @!P0 BRA `(.L_x_2) ;
.L_x_1:
        /*0020*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0030*/                   IMMA.16816.S8.S8 R8, R4.ROW, R6.COL, R10 ;
        /*0040*/                   FADD R12, R8, -12582912 ;
        /*0050*/                   FMUL R12, R12, R20 ;
        /*0060*/               @P1 FMUL R12, R12, R21 ;
        /*0070*/                   IADD3 R2, R2, 0x80, RZ ;
        /*0080*/                   ISETP.NE.AND P0, PT, R2, R3, PT ;
        /*0090*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*00a0*/                   EXIT ;
.text._Z5otherv:
.L_x_3:
        /*0000*/                   FADD R1, R1, R2 ;
        /*0010*/               @P0 BRA `(.L_x_3) ;
"""
# ... and as cuobjdump -sass writes it (absolute branch targets, encodings after the instruction).
CUOBJDUMP = """
        Function : _Z4gemmv
        /*0000*/                   S2R R0, SR_TID.X ;                     /* 0x0000000000007919 */
        /*0010*/              @!P0 BRA 0xa0 ;                             /* 0x0000000000208947 */
        /*0020*/                   LDSM.16.M88.4 R4, [R2] ;               /* 0x000000000204783b */
        /*0030*/                   IMMA.16816.S8.S8 R8, R4.ROW, R6.COL, R10 ; /* 0x0000000604087237 */
        /*0040*/                   FADD R12, R8, -12582912 ;              /* 0xcb4000000800c421 */
        /*0050*/                   FMUL R12, R12, R20 ;                   /* 0x000000140c0c7220 */
        /*0060*/               @P1 FMUL R12, R12, R21 ;                   /* 0x000000150c0c1220 */
        /*0070*/                   IADD3 R2, R2, 0x80, RZ ;               /* 0x0000008002027810 */
        /*0080*/                   ISETP.NE.AND P0, PT, R2, R3, PT ;      /* 0x000000030200720c */
        /*0090*/               @P0 BRA 0x20 ;                             /* 0xffffff8000000947 */
        /*00a0*/                   EXIT ;                                 /* 0x000000000000794d */
        Function : _Z5otherv
        /*0000*/                   FADD R1, R1, R2 ;                      /* 0x0000000201017221 */
        /*0010*/               @P0 BRA 0x0 ;                              /* 0xfffffffc00000947 */
"""

EXPECTED = ("_Z4gemmv\n  loop 0x0020-0x0090: 8 instructions, 128 bytes; FP32 3 (37.5%), integer/address 2 (25.0%), "
            "shared load 1 (12.5%), MMA 1 (12.5%), branch 1 (12.5%)\n")


def run(*args, stdin=None):
    return subprocess.run([sys.executable, TOOL, *args], input=stdin, capture_output=True, text=True)


def test_both_listing_formats_give_the_loop_and_its_mix(tmp_path):
    for text in (NVDISASM, CUOBJDUMP):
        r = run(stdin=text)
        assert (r.returncode, r.stdout, r.stderr) == (0, EXPECTED, "")
    f = tmp_path / "k.sass"
    f.write_text(NVDISASM)
    r = run(str(f), "--function", "gemm")
    assert (r.returncode, r.stdout) == (0, EXPECTED)


def test_no_matching_loop_and_a_bad_file_are_one_line_errors(tmp_path):
    r = run("--function", "other", stdin=NVDISASM)  # its loop has no IMMA
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "sass_loops.py: error: no loop with IMMA in a function matching 'other'\n"
    r = run("--function", "other", "--marker", "FADD", stdin=NVDISASM)
    assert r.returncode == 0 and r.stdout.startswith("_Z5otherv\n  loop 0x0000-0x0010: 2 instructions")
    bad = tmp_path / "bad.sass"
    bad.write_bytes(b"\xff\xfe")
    missing = tmp_path / "missing.sass"
    for path in (bad, missing):
        r = run(str(path))
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.startswith(f"sass_loops.py: error: {path}: ") and r.stderr.count("\n") == 1
