class Follower: pass
class FollowResult: pass
