# cmake -DIN=file -DOUT=file.cc -DSYM=name -P EmbedBinary.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR size "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT} "// Generated from ${IN}; do not edit.\n"
  "extern \"C\" {\n"
  "__attribute__((aligned(8))) extern const unsigned char ${SYM}[] = {\n${body}0x00};\n"
  "extern const unsigned long ${SYM}_size = ${size};\n}\n")
