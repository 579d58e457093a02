package agent

import (
	"encoding/binary"
	"syscall"
	"time"
	"unsafe"
)

// sock_diag(7): the kernel lists the listening TCP sockets of the agent's
// network namespace. Asking for listeners only is cheap (a few µs here);
// reading /proc/net/tcp walks every socket and cost 10 ms of CPU a read.
const (
	netlinkSockDiag   = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	tcpListenState    = 10 // TCP_LISTEN
	inetDiagReqV2Size = 56
	maxDiagMessages   = 1 << 16
)

// portListening reports whether a TCP socket listens on port (IPv4 or
// IPv6). It looks, it never connects: a connection would be seen by the
// worker.
func portListening(port int) bool {
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		if ok, err := listeningOn(family, port); err == nil && ok {
			return true
		}
	}
	return false
}

func listeningOn(family uint8, port int) (bool, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return false, err
	}
	defer syscall.Close(fd)
	tv := syscall.NsecToTimeval(int64(time.Second))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return false, err
	}
	// nlmsghdr, then inet_diag_req_v2: family, protocol, ext, pad,
	// states, and a zero inet_diag_sockid (a dump matches every socket).
	req := make([]byte, syscall.NLMSG_HDRLEN+inetDiagReqV2Size)
	hdr := (*syscall.NlMsghdr)(unsafe.Pointer(&req[0]))
	hdr.Len = uint32(len(req))
	hdr.Type = sockDiagByFamily
	hdr.Flags = syscall.NLM_F_REQUEST | syscall.NLM_F_DUMP
	hdr.Seq = 1
	body := req[syscall.NLMSG_HDRLEN:]
	body[0], body[1] = family, syscall.IPPROTO_TCP
	binary.NativeEndian.PutUint32(body[4:8], 1<<tcpListenState)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return false, err
	}
	buf := make([]byte, 64<<10)
	for seen := 0; seen < maxDiagMessages; {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return false, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, err
		}
		for _, m := range msgs {
			seen++
			switch m.Header.Type {
			case syscall.NLMSG_DONE:
				return false, nil
			case syscall.NLMSG_ERROR:
				return false, syscall.EINVAL
			}
			// inet_diag_msg: family, state, timer, retrans, then the
			// socket id, whose first field is the source port (big endian).
			if len(m.Data) >= 6 && int(binary.BigEndian.Uint16(m.Data[4:6])) == port {
				return true, nil
			}
		}
	}
	return false, nil
}
