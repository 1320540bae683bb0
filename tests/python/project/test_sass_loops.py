"""kernels/tools/sass_loops.py: the loop opcode mix read from both SASS listing formats."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOOL = os.path.join(ROOT, "kernels", "tools", "sass_loops.py")

# One kernel with a prologue, a forward branch, a loop of eight instructions (one FP32 of them guarded) and the
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


# A loop nested in another, the inner back edge a branch on a predicate operand and the outer one a divergent
# branch on a uniform register, then a second loop of the same function after them.
NESTED = """
        Function : _Z6nestedv
        /*0000*/                   IMMA.16816.S8.S8 R8, R4.ROW, R6.COL, R10 ;
        /*0010*/                   FFMA R1, R2, R3, R1 ;
        /*0020*/                   BRA.U !UP0, 0x10 ;
        /*0030*/                   LDS R5, [R6] ;
        /*0040*/                   BRA.DIV UR4, 0x0 ;
        /*0050*/                   IMMA.16816.S8.S8 R8, R4.ROW, R6.COL, R10 ;
        /*0060*/              @!P1 BRA 0x50 ;
        /*0070*/                   EXIT ;
"""


def test_nested_loops_and_branch_operand_forms():
    r = run(stdin=NESTED)  # the outer loop (with the inner one's body) and the second loop hold IMMA
    assert r.returncode == 0
    assert r.stdout == ("_Z6nestedv\n  loop 0x0000-0x0040: 5 instructions, 80 bytes; branch 2 (40.0%), MMA 1 (20.0%), "
                        "FP32 1 (20.0%), shared load 1 (20.0%)\n"
                        "_Z6nestedv\n  loop 0x0050-0x0060: 2 instructions, 32 bytes; MMA 1 (50.0%), branch 1 (50.0%)\n")
    r = run("--marker", "FFMA", stdin=NESTED)  # the inner loop first (its back edge comes first), then the outer
    assert r.returncode == 0
    assert [line.split(":")[0] for line in r.stdout.splitlines()[1::2]] == ["  loop 0x0010-0x0020",
                                                                          "  loop 0x0000-0x0040"]
    r = run("--function", "(", stdin=NESTED)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("sass_loops.py: error: --function '(': ")
    assert r.stderr.count("\n") == 1


def test_opcode_counts_of_whole_functions():
    # Every instruction of _Z4gemmv by opcode, modifiers and guard predicates dropped; ties in name order.
    want = "2 BRA\n2 FMUL\n1 EXIT\n1 FADD\n1 IADD3\n1 IMMA\n1 ISETP\n1 LDSM\n1 S2R\n11 TOTAL\n"
    for text in (NVDISASM, CUOBJDUMP):
        r = run("--function", "gemm", "--opcodes", stdin=text)
        assert (r.returncode, r.stdout, r.stderr) == (0, want, "")
    r = run("--function", "nothing", "--opcodes", stdin=CUOBJDUMP)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "sass_loops.py: error: no instruction in a function matching 'nothing'\n"
