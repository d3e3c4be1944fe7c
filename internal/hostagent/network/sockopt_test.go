package network_test

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

func unsafePointer(b []byte) unsafe.Pointer    { return unsafe.Pointer(&b[0]) }
func unsafePointer32(p *uint32) unsafe.Pointer { return unsafe.Pointer(p) }
func nativeUint32(b []byte) uint32             { return binary.NativeEndian.Uint32(b) }
func putNativeUint32(b []byte, v uint32)       { binary.NativeEndian.PutUint32(b, v) }

func setsockoptBytes(fd, level, opt int, b []byte) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0)
	if e != 0 {
		return e
	}
	return nil
}
