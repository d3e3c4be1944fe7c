package testkit

import (
	"bufio"
	"net"
	"net/http"
)

// EarlyAnswer sends req over conn and returns the server's answer, read
// apart from the writing of req's body. A server that refuses a request
// before reading its body answers and closes while the client is still
// sending: an http.Client may then report its write's broken pipe instead
// of the answer that came before it, where this reads the answer off the
// socket whatever the writes meet. The caller closes conn (which ends the
// writing too).
func EarlyAnswer(conn net.Conn, req *http.Request) (*http.Response, error) {
	go req.Write(conn)
	return http.ReadResponse(bufio.NewReader(conn), req)
}
