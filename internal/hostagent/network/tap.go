package network

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// tapFlags are the TAP's flags: Ethernet frames, no packet information
// header, a virtio-net header on every frame (QEMU's vnet_hdr=on).
const tapFlags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR

// VnetHdrLen is the length of the virtio-net header that precedes every
// frame read from or written to a TapFD, until its user changes it with
// TUNSETVNETHDRSZ (QEMU does).
const VnetHdrLen = 10

// tunAttach opens /dev/net/tun and attaches it to the TAP called name in
// the calling thread's namespace, creating it if it does not exist.
func tunAttach(name string, nonblock bool) (int, error) {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if nonblock {
		flags |= unix.O_NONBLOCK
	}
	fd, err := unix.Open("/dev/net/tun", flags, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(tapFlags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return fd, nil
}

// createTap makes a persistent TAP called name in the calling thread's
// namespace, attached to nothing.
func createTap(name string) error {
	fd, err := tunAttach(name, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("TUNSETPERSIST %s: %w", name, err)
	}
	return nil
}

// openTap attaches a new descriptor to the existing TAP name in the
// namespace fd, non-blocking and close-on-exec.
func openTap(nsfd int, name string) (*os.File, error) {
	var fd int
	err := inNetns(nsfd, func() (err error) {
		fd, err = tunAttach(name, true)
		return err
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
